#include "apps/generate.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <tuple>

#include "apps/default_model.hpp"
#include "engine/core/collective.hpp"
#include "apps/exec_runner.hpp"
#include "engine/driver/cpu_replica.hpp"
#include "engine/driver/driver.hpp"
#include "apps/oracle_runner.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/exec/cuda/cuda_executor.hpp"
#include "engine/exec/sampling.hpp"
#include "engine/load/peft.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"

namespace troupe::app {
namespace {

// One sequence sampled on the host from a runner's logits (the oracle, or a tensor-parallel rank) by
// the sampling head's own rules (engine/exec/sampling.hpp: draws keyed by (seed, token index), the
// sequence's history for penalties), so every backend and split gives what the driver gives.
template <class Runner>
result<std::pair<std::vector<std::int32_t>, nlohmann::json>, std::string> host_generate(Runner& run, const std::vector<std::int32_t>& prompt,
                                                                                     const generate_options& o,
                                                                                     const std::vector<std::int32_t>& eos,
                                                                                     std::int64_t vocab) {
  std::vector<std::int32_t> out;
  nlohmann::json logprobs = nlohmann::json::array();
  exec::sample_params params;
  params.temperature = static_cast<float>(o.temperature);
  params.top_k = static_cast<std::int32_t>(o.top_k);
  params.top_p = static_cast<float>(o.top_p);
  params.seed = o.seed;
  params.top_logprobs = static_cast<std::int32_t>(o.logprobs);
  if (auto c = exec::check(params); !c) return unexpected(c.error().message());
  auto history = exec::token_history::create(vocab, prompt);
  if (!history) return unexpected(history.error().message());
  exec::sample_scratch scratch;
  auto logits = run.feed(prompt);
  for (std::int64_t i = 0; i < o.max_tokens; ++i) {
    if (!logits) return unexpected(logits.error());
    auto pick = exec::sample_row(*logits, params, &*history, static_cast<std::uint64_t>(i), {}, scratch);
    if (!pick) return unexpected(pick.error().message());
    const auto next = pick->token;
    history->record(next);
    out.push_back(next);
    if (o.logprobs > 0) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& e : pick->top) top.push_back({{"id", e.token}, {"logprob", e.logprob}});
      logprobs.push_back(top);
    }
    if (std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    if (i + 1 < o.max_tokens) logits = run.feed(std::span(&out.back(), 1));
  }
  return std::make_pair(std::move(out), std::move(logprobs));
}

// The one constrained output the flags ask for (kind none when they ask for none).
result<guide::guide_spec, std::string> guide_of(const generate_options& o) {
  auto text_or_file = [](const std::string& v) -> result<std::string, std::string> {
    if (!v.starts_with("@")) return v;
    std::ifstream in(v.substr(1), std::ios::binary);
    if (!in) return unexpected("cannot read " + v.substr(1));
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  guide::guide_spec spec;
  if (!o.json_schema.empty()) {
    auto t = text_or_file(o.json_schema);
    if (!t) return unexpected("--json-schema: " + t.error());
    spec = {guide::guide_kind::json_schema, *t};
  } else if (o.json_object) {
    spec = {guide::guide_kind::json_object, ""};
  } else if (!o.regex.empty()) {
    spec = {guide::guide_kind::regex, o.regex};
  } else if (!o.grammar.empty()) {
    auto t = text_or_file(o.grammar);
    if (!t) return unexpected("--grammar: " + t.error());
    spec = {guide::guide_kind::grammar, *t};
  } else if (!o.choices.empty()) {
    spec = {guide::guide_kind::choice, nlohmann::json(o.choices).dump()};
  }
  return spec;
}

}  // namespace

int run_generate(const generate_options& o) {
  if (o.backend != "oracle" && o.backend != "cpu" && o.backend != "cuda") {
    std::fprintf(stderr, "troupe generate: unknown backend '%s' (cpu, cuda or oracle)\n", o.backend.c_str());
    return 2;
  }
  if (o.backend == "oracle" && (!o.json_schema.empty() || o.json_object || !o.regex.empty() || !o.grammar.empty() || !o.choices.empty())) {
    std::fprintf(stderr, "troupe generate: a constrained output runs on the driver path (--backend cpu or cuda), not the oracle\n");
    return 2;
  }
  if (o.expert_parallel > 1 && o.tensor_parallel > 1 && o.expert_parallel != o.tensor_parallel) {
    std::fprintf(stderr, "troupe generate: --expert-parallel spans the tensor-parallel group: give it %d, or leave --tensor-parallel out\n",
                 o.tensor_parallel);
    return 2;
  }
  if (o.backend == "cuda" && (o.tensor_parallel > 1 || o.pipeline_parallel > 1 || o.expert_parallel > 1)) {
    std::fprintf(stderr, "troupe generate: --tensor-parallel and --pipeline-parallel run on the cpu backend (simulated devices)\n");
    return 2;
  }
  const auto model = model_or_default(o.model, "generate");
  if (!model) {
    std::fprintf(stderr, "%s\n", model.error().c_str());
    return 2;
  }
  auto h = families::model_handle::load(*model, families::registry::builtin(), o.mmproj);
  if (!h) {
    std::fprintf(stderr, "troupe generate: %s\n", families::message(h.error()).c_str());
    return 2;
  }
  std::vector<families::image_u8> images;
  for (const auto& path : o.images) {
    std::ifstream f(path, std::ios::binary);
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto img = families::decode_image(bytes);
    if (!img) {
      std::fprintf(stderr, "troupe generate: --image %s: %s\n", path.c_str(), img.error().message().c_str());
      return 2;
    }
    images.push_back(std::move(*img));
  }
  if (!images.empty() && (o.backend == "oracle" || o.tensor_parallel > 1 || o.pipeline_parallel > 1 || o.expert_parallel > 1)) {
    std::fprintf(stderr, "troupe generate: --image runs on one rank of the driver path (--backend cpu or cuda)\n");
    return 2;
  }
  if (o.expert_parallel > 1) {
    if (o.backend != "cpu") {
      std::fprintf(stderr, "troupe generate: --expert-parallel runs on the cpu backend (simulated devices)\n");
      return 2;
    }
    auto ep = (*h)->expert_parallel();
    if (!ep) {
      std::fprintf(stderr, "troupe generate: %s\n", families::message(ep.error()).c_str());
      return 2;
    }
    h = std::move(*ep);
  }
  h = families::with_kv_type(*h, o.kv_type);
  if (!h) {
    std::fprintf(stderr, "troupe generate: %s\n", families::message(h.error()).c_str());
    return 2;
  }
  const text::text_codec* codec = (*h)->text();
  std::vector<std::int32_t> prompt_ids = o.prompt_ids;
  if (!o.has_prompt_ids) {
    if (!codec) {
      std::fprintf(stderr, "troupe generate: --prompt needs the model's tokenizer (%s); --prompt-ids works without one\n",
                   (*h)->text_problem().c_str());
      return 2;
    }
    auto ids = codec->encode(o.prompt, true);
    if (!ids) {
      std::fprintf(stderr, "troupe generate: %s\n", ids.error().message().c_str());
      return 2;
    }
    prompt_ids.assign(ids->begin(), ids->end());
  }
  const auto& cfg = (*h)->model().config();
  for (auto id : prompt_ids)
    if (id < 0 || id >= cfg.vocab) {
      std::fprintf(stderr, "troupe generate: prompt id %d is outside the vocabulary [0, %lld)\n", id, static_cast<long long>(cfg.vocab));
      return 2;
    }
  if (prompt_ids.empty()) {
    std::fprintf(stderr, "troupe generate: the prompt is empty\n");
    return 2;
  }
  // Each image's mark grows into the tower's rows and an end token (driver::with_images), so the
  // sequence is that much longer than the ids given.
  const std::int64_t image_rows = (*h)->vision() ? static_cast<std::int64_t>(images.size()) * ((*h)->vision()->spec.tokens() + 1) : 0;
  const std::int64_t capacity = static_cast<std::int64_t>(prompt_ids.size()) + image_rows + std::max<std::int64_t>(o.max_tokens, 1);
  std::vector<std::int32_t> out;
  nlohmann::json logprobs = nlohmann::json::array();
  nlohmann::json beams = nlohmann::json::array();
  if (o.backend == "cpu" || o.backend == "cuda") {
    // The served path: one sequence through the driver, sampled on the executor. With
    // --tensor-parallel N and --pipeline-parallel M the driver drives N x M ranks (threads of this
    // process, each an executor over its part, the ranks of a stage joined by an in-process group, the
    // stages by an in-process pipe); the last stage's rank 0 samples.
    if (o.logprobs > exec::max_top_logprobs) {
      std::fprintf(stderr, "troupe generate: --logprobs is at most %d\n", exec::max_top_logprobs);
      return 2;
    }
    if (o.max_tokens == 0) {
      std::printf(o.json ? "{\"tokens\":[],\"text\":\"\"}\n" : "\n");
      return 0;
    }
    const int n = std::max({1, o.tensor_parallel, o.expert_parallel}), stages = std::max(1, o.pipeline_parallel);
    // --threads is the replica's whole share of the machine: each rank gets its part.
    const int threads = o.threads > 0 ? std::max(1, static_cast<int>(o.threads) / (n * stages)) : 0;
    // On cuda: one executor on --device, the same driver over it.
    driver::driver_options opt;
    std::unique_ptr<driver::cpu_replica> replica;
    std::unique_ptr<exec::executor> device;
    exec::executor* ex = nullptr;
    std::shared_ptr<const families::model_handle> rank0 = *h;
    if (o.backend == "cuda") {
      exec::cuda::cuda_options co;
      co.device = o.device;
      auto made = exec::cuda::make_executor(co);
      if (!made) {
        std::fprintf(stderr, "troupe generate: the cuda backend: %s\n", made.error().message().c_str());
        return 2;
      }
      device = std::move(*made);
      ex = device.get();
    } else {
      auto r = driver::cpu_replica::make(*h, n, stages, threads);
      if (!r) {
        std::fprintf(stderr, "troupe generate: %s\n", r.error().c_str());
        return 2;
      }
      replica = std::move(*r);
      replica->attach(opt);
      ex = &replica->head_executor();
      rank0 = replica->head();
    }
    // A beam search decodes its beams as rows, and a recurrent model's search holds one row more.
    opt.max_rows = o.beams > 1 ? o.beams + 1 : 1;
    // The paged pool holds whole blocks: the capacity rounds up to one (max_tokens still bounds the output).
    opt.block_size = std::min<std::int64_t>(16, capacity);
    opt.capacity = (capacity + opt.block_size - 1) / opt.block_size * opt.block_size;
    opt.prefill_chunk = std::min<std::int64_t>(256, capacity);
    opt.token_budget = opt.prefill_chunk + 1;
    opt.prefix_cache = false;
    opt.chain_steps = o.chain;
    if (!o.adapter.empty()) {
      // One slot of the adapter's own rank (the pools hold max_rank columns per target linear).
      auto a = load::read_lora_adapter(o.adapter);
      if (!a) {
        std::fprintf(stderr, "troupe generate: --adapter: %s\n", a.error().message().c_str());
        return 2;
      }
      opt.adapters.slots = 1;
      opt.adapters.max_rank = a->rank;
    }
    if (o.speculation.any()) {
      auto sp = speculation_of(o.speculation);
      if (!sp) {
        std::fprintf(stderr, "troupe generate: %s\n", sp.error().c_str());
        return 2;
      }
      opt.speculation = *sp;
      // A window never longer than the sequence's whole capacity.
      opt.speculation.tokens = std::min(opt.speculation.tokens, opt.capacity - 1);
      if (opt.speculation.tokens < 1) opt.speculation.kind = driver::draft_kind::none;
    }
    auto prepared = driver::driver<driver::unprepared>(rank0, *ex, opt).prepare();
    if (!prepared) {
      std::fprintf(stderr, "troupe generate: %s\n", prepared.error().second.message().c_str());
      return 1;
    }
    driver::seq_request req;
    if (!o.adapter.empty()) {
      if (auto a = prepared->load_adapter("adapter", o.adapter); !a) {
        std::fprintf(stderr, "troupe generate: %s\n", a.error().message().c_str());
        return 2;
      }
      req.adapter = "adapter";
    }
    req.prompt = prompt_ids;
    if (!images.empty() || (*h)->vision()) {  // a model with a vision tower: its image marks need images
      auto r = prepared->with_images(std::move(req), images);
      if (!r) {
        std::fprintf(stderr, "troupe generate: %s\n", r.error().message().c_str());
        return 2;
      }
      req = std::move(*r);
    }
    req.max_tokens = o.max_tokens;
    req.sampling.temperature = static_cast<float>(o.temperature);
    req.sampling.top_k = static_cast<std::int32_t>(o.top_k);
    req.sampling.top_p = static_cast<float>(o.top_p);
    req.sampling.seed = o.seed;
    req.sampling.top_logprobs = static_cast<std::int32_t>(o.logprobs);
    auto guided = guide_of(o);
    if (!guided) {
      std::fprintf(stderr, "troupe generate: %s\n", guided.error().c_str());
      return 2;
    }
    req.guided = std::move(*guided);
    req.beams = o.beams;
    req.length_penalty = static_cast<float>(o.length_penalty);
    req.early_stopping = o.early_stopping;
    // Plain text streams as the driver's detokenizer releases it (what a server's stream sends), with
    // the timing on stderr; --json prints one object at the end.
    const bool stream_text = !o.json && codec;
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<double> first_ms;
    std::int64_t drawn = 0;
    auto sink = [&](const driver::seq_update& u) {
      if (!u.tokens.empty() && !first_ms) first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      drawn += static_cast<std::int64_t>(u.tokens.size());
      if (stream_text && !u.text.empty()) {
        std::fwrite(u.text.data(), 1, u.text.size(), stdout);
        std::fflush(stdout);
      }
    };
    auto g = prepared->generate(std::move(req), sink);
    if (g && stream_text) {
      std::printf("\n");
      const double total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const double decode_ms = total - first_ms.value_or(total);
      std::fprintf(stderr, "troupe generate: %zu prompt tokens, first token after %.1f ms, %lld tokens, %.1f tok/s after the first (%s)\n",
                   prompt_ids.size(), first_ms.value_or(0.0), static_cast<long long>(drawn),
                   drawn > 1 && decode_ms > 0 ? static_cast<double>(drawn - 1) * 1000.0 / decode_ms : 0.0,
                   std::string(driver::name(g->finished)).c_str());
      for (std::size_t b = 0; b < g->beams.size(); ++b)
        std::fprintf(stderr, "troupe generate: beam %zu: score %.4f, logprob %.4f (%s): %s\n", b, g->beams[b].score, g->beams[b].logprob,
                     std::string(driver::name(g->beams[b].finished)).c_str(), g->beams[b].text.c_str());
      if (const auto c = prepared->counters(); c.draft_tokens > 0)
        std::fprintf(stderr, "troupe generate: speculation %s: %lld of %lld drafts accepted over %lld verify steps\n",
                     std::string(driver::name(opt.speculation.kind)).c_str(), static_cast<long long>(c.accepted_tokens),
                     static_cast<long long>(c.draft_tokens), static_cast<long long>(c.verify_steps));
      return 0;
    }
    if (!g) {
      std::fprintf(stderr, "troupe generate: %s\n", g.error().message().c_str());
      return g.error().code == driver::driver_error_code::step_failed ? 1 : 2;
    }
    out = g->tokens;
    for (const auto& b : g->beams)
      beams.push_back({{"tokens", b.tokens}, {"text", b.text}, {"logprob", b.logprob}, {"score", b.score}, {"finish_reason", driver::name(b.finished)}});
    for (const auto& p : g->picks) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& e : p.top) top.push_back({{"id", e.token}, {"logprob", e.logprob}});
      logprobs.push_back(top);
    }
  } else if (o.pipeline_parallel > 1) {
    std::fprintf(stderr, "troupe generate: --pipeline-parallel runs on the cpu backend (the driver feeds every stage)\n");
    return 2;
  } else if (o.tensor_parallel <= 1) {
    oracle_runner run(*h, capacity);
    auto r = host_generate(run, prompt_ids, o, cfg.eos_ids, cfg.vocab);
    if (!r) {
      std::fprintf(stderr, "troupe generate: %s\n", r.error().c_str());
      return 1;
    }
    std::tie(out, logprobs) = std::move(*r);
  }
  if (o.tensor_parallel > 1 && o.backend == "oracle") {
    // The oracle split over N ranks (threads of this process, each evaluating its shard's graphs, the
    // collectives meeting in an in-process group). Every rank ends each step with the same logits, so
    // each draws the same token with the same rules; rank 0's answer is printed.
    const int n = o.tensor_parallel;
    auto group = local_group(n);
    std::vector<result<std::pair<std::vector<std::int32_t>, nlohmann::json>, std::string>> results(
        static_cast<std::size_t>(n), unexpected(std::string("not run")));
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r)
      ranks.emplace_back([&, r] {
        auto& res = results[static_cast<std::size_t>(r)];
        auto shard = (*h)->shard(r, n);
        if (!shard) {
          res = unexpected(families::message(shard.error()));
          return;
        }
        oracle_runner run(*shard, capacity, group[static_cast<std::size_t>(r)].get());
        res = host_generate(run, prompt_ids, o, cfg.eos_ids, cfg.vocab);
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < n; ++r)
      if (!results[static_cast<std::size_t>(r)]) {
        std::fprintf(stderr, "troupe generate: --tensor-parallel %d: rank %d: %s\n", n, r, results[static_cast<std::size_t>(r)].error().c_str());
        return 1;
      }
    std::tie(out, logprobs) = std::move(*results[0]);
  }
  if (o.json) {
    nlohmann::json j;
    j["tokens"] = out;
    if (codec) {
      j["text"] = codec->decode(out, true);
    } else {
      j["text"] = nullptr;  // no tokenizer: ids only
    }
    if (o.logprobs > 0) j["logprobs"] = logprobs;
    if (!beams.empty()) j["beams"] = beams;
    std::printf("%s\n", j.dump().c_str());
  } else {
    if (codec) {
      std::printf("%s\n", codec->decode(out, true).c_str());
    } else {
      for (std::size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
      std::printf("\n");
    }
  }
  return 0;
}

int run_fixture(const fixture_options& o) {
  if (o.family == "gemma3_vl") {
    families::vlm_fixture v;
    v.text.vocab = 512, v.text.hidden = 64, v.text.ffn = 128, v.text.layers = 2, v.text.heads = 4, v.text.kv_heads = 2, v.text.head_dim = 16;
    const std::filesystem::path dir(o.out);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    auto r = families::write_vlm_fixture(v, dir / "hf", dir / "text.gguf", dir / "mmproj.gguf");
    if (r) r = families::write_test_image(dir / "image.png", 48, 40, o.seed);
    if (r) r = families::write_test_image(dir / "square.png", 32, 32, o.seed + 1);
    if (!r) {
      std::fprintf(stderr, "troupe %s\n", r.error().message().c_str());
      return 2;
    }
    std::printf("%s\n", o.out.c_str());
    return 0;
  }
  if (!o.lora_to_gguf.empty()) {
    auto r = families::write_lora_gguf(o.lora_to_gguf, o.gguf_base, o.out);
    if (!r) {
      std::fprintf(stderr, "troupe %s\n", r.error().message().c_str());
      return 2;
    }
    std::printf("%s\n", o.out.c_str());
    return 0;
  }
  if (!o.lora_over.empty()) {
    families::lora_fixture l;
    l.rank = o.lora_rank;
    l.alpha = 2.0 * static_cast<double>(o.lora_rank);
    l.seed = o.seed;
    auto r = o.merged_with.empty() ? families::write_lora_adapter(o.lora_over, l, o.out) : families::write_lora_merged(o.lora_over, o.merged_with, o.out);
    if (!r) {
      std::fprintf(stderr, "troupe %s\n", r.error().message().c_str());
      return 2;
    }
    std::printf("%s\n", o.out.c_str());
    return 0;
  }
  families::fixture_dims d;
  std::int64_t* fields[] = {&d.vocab, &d.hidden, &d.ffn, &d.layers, &d.heads, &d.kv_heads, &d.head_dim, &d.max_positions};
  if (o.dims.size() > std::size(fields)) {
    std::fprintf(stderr, "troupe fixture: --dims takes at most 8 values (vocab, hidden, ffn, layers, heads, kv_heads, head_dim, max_positions)\n");
    return 2;
  }
  for (std::size_t i = 0; i < o.dims.size(); ++i) *fields[i] = o.dims[i];
  const auto type = dtype_from_name(o.type);
  if (!type) {
    std::fprintf(stderr, "troupe fixture: unknown --type '%s'\n", o.type.c_str());
    return 2;
  }
  d.matrix_type = *type;
  d.tied = o.tied;
  d.legacy_gguf = o.legacy_gguf;
  d.mtp_layers = o.mtp ? 1 : 0;
  std::int64_t* routed[] = {&d.experts, &d.experts_used, &d.expert_ffn, &d.shared_ffn};
  if (o.experts.size() > std::size(routed)) {
    std::fprintf(stderr, "troupe fixture: --experts takes at most 4 values (experts, per token, expert width, shared width)\n");
    return 2;
  }
  for (std::size_t i = 0; i < o.experts.size(); ++i) *routed[i] = o.experts[i];
  std::int64_t* ssm[] = {&d.ssm_state, &d.ssm_groups, &d.ssm_conv, &d.ssm_expand};
  if (o.ssm.size() > std::size(ssm)) {
    std::fprintf(stderr, "troupe fixture: --ssm takes at most 4 values (state size, groups, conv kernel, expansion)\n");
    return 2;
  }
  for (std::size_t i = 0; i < o.ssm.size(); ++i) *ssm[i] = o.ssm[i];
  if (!o.hf_quant.empty() && o.gguf) {
    std::fprintf(stderr, "troupe fixture: --hf-quant writes the Hugging Face form (leave out --gguf)\n");
    return 2;
  }
  d.hf_quant = o.hf_quant;
  d.hf_quant_reference = o.hf_quant_reference;
  auto r = families::write_fixture(o.family, d, o.out, o.gguf);
  if (!r) {
    std::fprintf(stderr, "troupe %s\n", r.error().message().c_str());
    return 2;
  }
  std::printf("%s\n", o.out.c_str());
  return 0;
}

}  // namespace troupe::app

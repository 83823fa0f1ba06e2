#include "engine/driver/driver.hpp"

#include <algorithm>
#include <cmath>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {

// ---- names and messages -----------------------------------------------------------------------------

std::string_view name(driver_error_code c) {
  switch (c) {
    case driver_error_code::bad_options: return "bad_options";
    case driver_error_code::prepare_failed: return "prepare_failed";
    case driver_error_code::entry_limit: return "entry_limit";
    case driver_error_code::byte_limit: return "byte_limit";
    case driver_error_code::bad_request: return "bad_request";
    case driver_error_code::bad_input: return "bad_input";
    case driver_error_code::incompatible: return "incompatible";
    case driver_error_code::unsupported_feature: return "unsupported_feature";
    case driver_error_code::no_head: return "no_head";
    case driver_error_code::too_long: return "too_long";
    case driver_error_code::pool_too_small: return "pool_too_small";
    case driver_error_code::unknown_sequence: return "unknown_sequence";
    case driver_error_code::program_not_offered: return "program_not_offered";
    case driver_error_code::step_failed: return "step_failed";
    case driver_error_code::unbound_slot: return "unbound_slot";
    case driver_error_code::unknown_adapter: return "unknown_adapter";
    case driver_error_code::bad_adapter: return "bad_adapter";
    case driver_error_code::adapter_busy: return "adapter_busy";
  }
  return "unknown";
}

std::string driver_error::message() const {
  std::string m = reason + " (" + std::string(name(code)) + ")";
  if (input) m += ": " + input->message();
  if (pair) m += ": " + std::string(name(pair->a)) + " with " + std::string(name(pair->b)) + ": " + pair->reason;
  return m;
}

std::string_view name(finish_reason r) {
  switch (r) {
    case finish_reason::eos: return "eos";
    case finish_reason::stop_string: return "stop_string";
    case finish_reason::length: return "length";
    case finish_reason::capacity: return "capacity";
    case finish_reason::cancelled: return "cancelled";
    case finish_reason::pool_exhausted: return "pool_exhausted";
    case finish_reason::error: return "error";
  }
  return "unknown";
}

std::string entry_key::str() const {
  std::string s = std::string(families::program_name(program)) + " " + shape.str() + (head == head_kind::sample ? " head=sample" : " head=logits");
  for (const auto& c : carried) s += " +" + c;
  return s;
}
// ---- driver<unprepared> -----------------------------------------------------------------------------

driver<unprepared>::driver(std::shared_ptr<const families::model_handle> handle, exec::executor& ex, driver_options options)
    : s_(std::make_unique<driver_state>()) {
  s_->handle = std::move(handle);
  s_->ex = &ex;
  s_->options = options;
}
driver<unprepared>::driver(std::unique_ptr<driver_state> s) : s_(std::move(s)) {}
driver<unprepared>::driver(driver&&) noexcept = default;
driver<unprepared>& driver<unprepared>::operator=(driver&&) noexcept = default;
driver<unprepared>::~driver() = default;
const driver_options& driver<unprepared>::options() const { return s_->options; }

result<driver<serving>, std::pair<driver<unprepared>, driver_error>> driver<unprepared>::prepare() && {
  auto r = s_->prepare();
  if (!r) {
    auto err = r.error();
    return unexpected(std::pair<driver<unprepared>, driver_error>(driver<unprepared>(std::move(s_)), std::move(err)));
  }
  const auto preload = s_->options.adapters.preload;
  driver<serving> d(std::move(s_));
  for (const auto& [name, path] : preload)
    if (auto a = d.load_adapter(name, path); !a)
      return unexpected(std::pair<driver<unprepared>, driver_error>(driver<unprepared>(std::move(d.s_)), a.error()));
  return d;
}

// ---- driver<serving> --------------------------------------------------------------------------------

driver<serving>::driver(std::unique_ptr<driver_state> s) : s_(std::move(s)) {}
driver<serving>::driver(driver&&) noexcept = default;
driver<serving>& driver<serving>::operator=(driver&&) noexcept = default;
driver<serving>::~driver() {
  if (!s_) return;
  for (auto& [id, s] : s_->seqs) s_->ex->close_history(id);
}
const driver_options& driver<serving>::options() const { return s_->options; }
const families::model_handle& driver<serving>::model() const { return *s_->handle; }
std::vector<entry_key> driver<serving>::entries() const { return s_->entry_order; }
bool driver<serving>::idle() const { return s_->waiting.empty() && s_->running.empty(); }

driver_counters driver<serving>::counters() const {
  auto c = s_->counters;
  c.pool_available = s_->pool->available();
  c.waiting = static_cast<std::int64_t>(s_->waiting.size());
  c.running = static_cast<std::int64_t>(s_->running.size());
  if (s_->drafts) c.draft_steps = s_->drafts->steps();
  return c;
}

result<seq_id, driver_error> driver<serving>::open(seq_request req) {
  auto& st = *s_;
  auto refuse = [](driver_error_code c, std::string why) { return unexpected(driver_error{c, std::move(why)}); };
  if (!st.handle->model().schema().offers(families::program::step))
    return refuse(driver_error_code::program_not_offered,
                  "the model (" + st.handle->model().config().family + ") is an encoder: it embeds and does not generate");
  // Features first: the request's against the driver's, through the one table.
  std::vector<feature> active;
  if (st.options.paged) active.push_back(feature::paged_pool);
  if (st.options.prefix_cache) active.push_back(feature::prefix_cache);
  if (!req.inputs.empty()) active.push_back(feature::request_inputs);
  if (req.beams > 1) active.push_back(feature::beam_search);
  if (!req.adapter.empty()) active.push_back(feature::adapter);
  if (req.resume) active.push_back(feature::resume);
  if (st.speculates() && req.speculate) active.push_back(feature::draft_policy);
  if (st.recurrent) active.push_back(feature::recurrent_state);
  if (auto c = check_compatible(active))
    return unexpected(driver_error{driver_error_code::incompatible, "the request's features do not compose", std::nullopt, *c});
  for (auto f : active)
    if (!implemented(f)) return refuse(driver_error_code::unsupported_feature, std::string(name(f)) + " is not offered by this driver");
  if (!req.adapter.empty() && !st.adapters.contains(req.adapter))
    return refuse(driver_error_code::unknown_adapter, "adapter '" + req.adapter + "' is not loaded in this driver");
  if (req.beams < 1) return refuse(driver_error_code::bad_request, "beams must be at least 1");
  if (req.beams > 1) {
    const auto& sp = req.sampling;
    // A recurrent model's search holds one row more than its beams (the spare its state reorder uses).
    const std::int64_t rows = st.options.max_rows - (st.recurrent ? 1 : 0);
    if (req.beams > exec::max_top_logprobs / 2 || req.beams > rows)
      return refuse(driver_error_code::bad_request, "beams must be at most " + std::to_string(std::min<std::int64_t>(exec::max_top_logprobs / 2, rows)) +
                                                        " (half the top log-probabilities a step reports, and the driver's rows" +
                                                        (st.recurrent ? " less the spare a recurrent model's search holds)" : ")"));
    if (sp.temperature != 0.0f || sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f)
      return refuse(driver_error_code::bad_request, "beam search ranks by log-probability: temperature 0 and no penalties");
    if (req.guided.kind != guide::guide_kind::none || req.guide || !req.stop.empty() || !req.prior_output.empty() || req.head != head_kind::sample)
      return refuse(driver_error_code::bad_request, "beam search takes no guide, stop strings, prior output or logits head");
    if (!st.ranks.empty()) return refuse(driver_error_code::unsupported_feature, "beam search runs on a one-rank replica (its forks copy KV rows on one executor)");
    if (!std::isfinite(req.length_penalty)) return refuse(driver_error_code::bad_request, "length_penalty must be finite");
    req.sampling.top_logprobs = 2 * req.beams;  // the candidates of each beam
  }

  const auto n = static_cast<std::int64_t>(req.prompt.size());
  if (n == 0) return refuse(driver_error_code::bad_request, "the prompt is empty");
  for (std::size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= st.vocab)
      return refuse(driver_error_code::bad_request,
                    "prompt token " + std::to_string(i) + " is id " + std::to_string(req.prompt[i]) + ", outside the vocabulary of " + std::to_string(st.vocab));
  if (auto c = check_inputs(st.handle->model().schema(), n, req.inputs); !c)
    return unexpected(driver_error{driver_error_code::bad_input, "request inputs refused", c.error()});
  if (auto c = exec::check(req.sampling); !c) return refuse(driver_error_code::bad_request, c.error().message());
  for (const auto& [id, b] : req.logit_bias)
    if (id < 0 || id >= st.vocab || !std::isfinite(b)) return refuse(driver_error_code::bad_request, "logit bias on id " + std::to_string(id) + " is out of range or not finite");
  std::shared_ptr<guide::guide> guided;  // hooked once max_tokens is known (the guide completes within it)
  if (req.guided.kind != guide::guide_kind::none) {
    if (req.guide) return refuse(driver_error_code::bad_request, "a request has a guide spec or a guide function, not both");
    const auto* codec = st.handle->text();
    if (!codec) return refuse(driver_error_code::bad_request, "guided decoding needs the model's tokenizer: " + st.handle->text_problem());
    if (!st.guides)
      st.guides = std::make_unique<guide::guide_cache>(
          std::make_shared<const guide::vocabulary>(guide::vocabulary::of(codec->tokens(), static_cast<std::size_t>(st.vocab), st.eos)));
    auto g = st.guides->get(req.guided);
    if (!g) return refuse(driver_error_code::bad_request, std::string(guide::name(req.guided.kind)) + ": " + g.error().message());
    guided = std::move(*g);
  }
  // 0: as many tokens as the capacity (and the pool) leave after the prompt, for a client that named
  // no bound (the gateway's chat default).
  if (req.max_tokens == 0) {
    req.max_tokens = std::min(st.options.capacity, st.pool_blocks * st.block_size) - n;
    if (req.max_tokens < 1)
      return refuse(driver_error_code::too_long, "the prompt (" + std::to_string(n) + ") leaves no room in the capacity of " +
                                                     std::to_string(st.options.capacity) + " positions");
  }
  if (req.max_tokens < 1) return refuse(driver_error_code::bad_request, "max_tokens must be at least 1");
  if (static_cast<std::int64_t>(req.prior_output.size()) >= req.max_tokens)
    return refuse(driver_error_code::bad_request, "the prior output already holds max_tokens tokens");
  for (auto t : req.prior_output)
    if (t < 0 || t >= st.vocab) return refuse(driver_error_code::bad_request, "a prior output id is outside the vocabulary");
  if (n + req.max_tokens > st.options.capacity)
    return refuse(driver_error_code::too_long, "prompt (" + std::to_string(n) + ") + max_tokens (" + std::to_string(req.max_tokens) +
                                                   ") exceeds the capacity of " + std::to_string(st.options.capacity) + " positions");
  const std::int64_t blocks_needed = (n + req.max_tokens + st.block_size - 1) / st.block_size;
  if (blocks_needed > st.pool_blocks)
    return refuse(driver_error_code::pool_too_small,
                  "the request needs " + std::to_string(blocks_needed) + " KV blocks; the pool holds " + std::to_string(st.pool_blocks));
  if (req.head == head_kind::logits && !st.options.logits_head)
    return refuse(driver_error_code::no_head, "the request asks for logits and no Head::Logits entry is prepared");
  const auto* codec = st.handle->text();
  if (!req.stop.empty() && !codec) return refuse(driver_error_code::bad_request, "stop strings need the model's tokenizer: " + st.handle->text_problem());
  if (guided) req.guide = guide::hook(std::move(guided), req.max_tokens);

  sequence s;
  s.id = st.next_id++;
  s.tokens = req.prompt;
  s.prompt_len = n;
  s.cacheable = req.inputs.empty();
  if (const auto it = req.inputs.find("attend_until"); it != req.inputs.end() && it->second.values.type() == dtype::i32) {
    // Positions that see keys after them are written in one step: each reach stays in the prompt and
    // within a prefill chunk.
    const auto& v = it->second;
    const auto* u = v.values.as<std::int32_t>();
    for (std::int64_t i = 0; i < v.values.shape()[0]; ++i) {
      const std::int64_t p = v.positions.empty() ? i : v.positions[static_cast<std::size_t>(i)];
      if (u[i] >= 0 && (u[i] < p || u[i] >= n || u[i] - p >= st.options.prefill_chunk))
        return unexpected(driver_error{driver_error_code::bad_input, "request inputs refused",
                                       input_error{input_error_code::position_outside, "attend_until",
                                                   "position " + std::to_string(p) + " reaches " + std::to_string(u[i]) +
                                                       ": before itself, past the prompt or past a prefill chunk of " +
                                                       std::to_string(st.options.prefill_chunk)}});
    }
  }
  s.stop_ids = req.stop_ids;
  if (codec) {
    text::detokenizer_options o;
    o.stop = req.stop;
    s.detok.emplace(*codec, o);
  }
  if (auto h = st.ex->open_history(s.id, st.vocab, req.prompt, req.logit_bias); !h)
    return refuse(driver_error_code::bad_request, h.error().message());
  if (!req.prior_output.empty()) {
    st.ex->record_history(s.id, req.prior_output);
    s.tokens.insert(s.tokens.end(), req.prior_output.begin(), req.prior_output.end());
    s.generated = static_cast<std::int64_t>(req.prior_output.size());
    if (s.detok)
      for (auto t : req.prior_output) (void)s.detok->push(t);  // already delivered: only the stop matcher's state matters
  }
  s.req = std::move(req);
  st.index_inputs(s);
  if (s.req.beams > 1) s.group = s.id;
  const auto id = s.id;
  st.seqs.emplace(id, std::move(s));
  if (st.seqs.at(id).group != 0) st.groups[id].live = {id}, st.groups[id].logprob = {0.0};
  st.waiting.push_back(id);
  return id;
}

result<step_report, driver_error> driver<serving>::step() { return s_->round(); }

result<void, driver_error> driver<serving>::cancel(seq_id id) {
  auto it = s_->seqs.find(id);
  if (it == s_->seqs.end()) return unexpected(driver_error{driver_error_code::unknown_sequence, "no sequence " + std::to_string(id)});
  it->second.cancel = true;
  return {};
}

result<void, driver_error> driver<serving>::release(seq_id id) {
  auto it = s_->seqs.find(id);
  if (it == s_->seqs.end()) return unexpected(driver_error{driver_error_code::unknown_sequence, "no sequence " + std::to_string(id)});
  s_->finish(it->second, finish_reason::cancelled);
  s_->seqs.erase(it);
  return {};
}

result<generation, driver_error> driver<serving>::generate(seq_request request, const std::function<void(const seq_update&)>& sink) {
  auto id = open(std::move(request));
  if (!id) return unexpected(id.error());
  generation g;
  for (;;) {
    auto r = step();
    if (!r) {
      (void)release(*id);
      return unexpected(r.error());
    }
    for (const auto& u : r->updates) {
      if (u.id != *id) continue;
      g.tokens.insert(g.tokens.end(), u.tokens.begin(), u.tokens.end());
      if (!u.beams.empty()) g.beams = u.beams;
      g.picks.insert(g.picks.end(), u.picks.begin(), u.picks.end());
      g.text += u.text;
      if (sink) sink(u);
      if (u.finished) {
        g.finished = *u.finished;
        (void)release(*id);
        return g;
      }
    }
  }
}

// Rows are grouped by the chunk bucket that holds them and run up to encode_batch rows per step (an
// entry per (rows, tokens) shape, added when first needed unless options.encode prepared the full-chunk
// one); padded rows hold one token so that no query attends to nothing.
result<std::vector<tensor>, driver_error> driver<serving>::encode(std::span<const std::vector<std::int32_t>> rows) {
  auto& st = *s_;
  if (!st.handle->model().schema().offers(families::program::encode))
    return unexpected(driver_error{driver_error_code::program_not_offered, "the model offers no encode program"});
  const auto T_max = st.options.prefill_chunk;
  for (const auto& row : rows) {
    const auto n = static_cast<std::int64_t>(row.size());
    if (n == 0 || n > T_max)
      return unexpected(driver_error{driver_error_code::bad_request, "an encode row holds 1 to " + std::to_string(T_max) + " tokens"});
    for (std::size_t t = 0; t < row.size(); ++t)
      if (row[t] < 0 || row[t] >= st.vocab)
        return unexpected(driver_error{driver_error_code::bad_request, "encode token " + std::to_string(t) + " is outside the vocabulary"});
  }
  constexpr std::int64_t encode_batch = 4;
  std::vector<tensor> out(rows.size());
  std::map<std::int64_t, std::vector<std::size_t>> by_bucket;
  for (std::size_t i = 0; i < rows.size(); ++i)
    by_bucket[*std::lower_bound(st.chunk_buckets.begin(), st.chunk_buckets.end(), static_cast<std::int64_t>(rows[i].size()))].push_back(i);
  for (const auto& [T, members] : by_bucket)
    for (std::size_t first = 0; first < members.size(); first += encode_batch) {
      const auto take = std::min<std::size_t>(encode_batch, members.size() - first);
      const std::int64_t R = take == 1 ? 1 : encode_batch;
      const auto key = st.encode_key(R, T);
      if (!st.entries.contains(key))
        if (auto a = st.add(key); !a) return unexpected(a.error());
      tensor ids(dtype::i32, {R * T}), pos(dtype::i32, {R * T}), mask(dtype::i32, {R * T});
      for (std::int64_t r = 0; r < R; ++r) {
        const std::vector<std::int32_t>* row = static_cast<std::size_t>(r) < take ? &rows[members[first + static_cast<std::size_t>(r)]] : nullptr;
        const auto n = row ? static_cast<std::int64_t>(row->size()) : 1;
        for (std::int64_t t = 0; t < T; ++t) {
          const bool real = t < n;
          ids.as<std::int32_t>()[r * T + t] = real && row ? (*row)[static_cast<std::size_t>(t)] : 0;
          pos.as<std::int32_t>()[r * T + t] = real ? static_cast<std::int32_t>(t) : 0;
          mask.as<std::int32_t>()[r * T + t] = real ? 1 : 0;
        }
      }
      const auto in = st.bind(key, {.token_ids = ids.view(), .positions = pos.view(), .token_mask = mask.view()});
      std::optional<others_run> others;
      if (!st.ranks.empty()) others.emplace(st.rank_threads(), key, in);
      auto r = st.ex->step(st.entries.at(key), in);
      if (others)
        if (auto e = others->wait(); e && r) r = unexpected(*e);
      if (!r) return unexpected(driver_error{driver_error_code::step_failed, "encode: " + r.error().message()});
      auto it = r->outputs.find("hidden");
      if (it == r->outputs.end()) return unexpected(driver_error{driver_error_code::step_failed, "encode returned no hidden states"});
      const auto H = it->second.shape().back();
      for (std::size_t k = 0; k < take; ++k) {
        const auto i = members[first + k];
        const auto n = static_cast<std::int64_t>(rows[i].size());
        tensor h(dtype::f32, {n, H});
        const float* src = it->second.as<float>() + static_cast<std::int64_t>(k) * T * H;
        std::copy(src, src + n * H, h.as<float>());
        out[i] = std::move(h);
      }
      ++st.counters.executor_steps;
    }
  return out;
}

result<std::vector<std::vector<float>>, driver_error> driver<serving>::embed(std::span<const std::vector<std::int32_t>> rows,
                                                                           const families::pooling& how) {
  auto hidden = encode(rows);
  if (!hidden) return unexpected(hidden.error());
  std::vector<std::vector<float>> out;
  out.reserve(hidden->size());
  for (const auto& h : *hidden) {
    const auto n = h.shape().dims()[0], H = h.shape().dims()[1];
    const float* x = h.as<float>();
    std::vector<double> acc(static_cast<std::size_t>(H), 0.0);
    if (how.mode == families::pooling_mode::mean) {
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t c = 0; c < H; ++c) acc[static_cast<std::size_t>(c)] += x[t * H + c];
      for (auto& v : acc) v /= static_cast<double>(n);
    } else {
      const std::int64_t t = how.mode == families::pooling_mode::cls ? 0 : n - 1;
      for (std::int64_t c = 0; c < H; ++c) acc[static_cast<std::size_t>(c)] = x[t * H + c];
    }
    double norm = 0;
    for (auto v : acc) norm += v * v;
    norm = std::sqrt(norm);
    std::vector<float> v(acc.size());
    for (std::size_t c = 0; c < acc.size(); ++c) v[c] = static_cast<float>(how.normalize && norm > 0 ? acc[c] / norm : acc[c]);
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace troupe::driver

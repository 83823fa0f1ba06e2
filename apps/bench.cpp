#include "apps/bench.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "apps/exec_runner.hpp"
#include "apps/cluster_module.hpp"
#include "engine/core/collective.hpp"
#include "engine/driver/cpu_replica.hpp"
#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/exec/cuda/cuda_executor.hpp"
#include "engine/exec/cpu/thread_pool.hpp"

namespace troupe::app {

double measure_read_bandwidth(std::size_t bytes, int threads) {
  exec::cpu::thread_pool pool(threads);
  const std::size_t n = bytes / sizeof(std::uint64_t);
  std::vector<std::uint64_t> buf(n);
  for (std::size_t i = 0; i < n; ++i) buf[i] = i;
  const std::int64_t tasks = 64;
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(pool.size()) * 8, 0);  // one cache line per thread
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(tasks, [&](std::int64_t t, int th) {
      const std::size_t lo = n * static_cast<std::size_t>(t) / tasks, hi = n * static_cast<std::size_t>(t + 1) / tasks;
      std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (std::size_t i = lo; i + 4 <= hi; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      sums[static_cast<std::size_t>(th) * 8] += s0 + s1 + s2 + s3;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(std::uint64_t)) / s);
  }
  std::uint64_t keep = 0;
  for (auto v : sums) keep += v;
  if (keep == 42) std::puts("");  // the sums must be used
  return best;
}

namespace {

// What the products run on at `level`: the AMX units in use, or why none is (the avx512 level only).
std::string amx_text(exec::cpu::isa level) {
  if (level != exec::cpu::isa::avx512) return "off: the " + std::string(exec::cpu::isa_name(level)) + " level";
  const auto& a = exec::cpu::amx();
  std::string on = std::string(a.bf16 ? "bf16" : "") + (a.bf16 && a.int8 ? "," : "") + (a.int8 ? "int8" : "");
  if (on.empty()) return "off: " + a.why_not;
  return on;
}
std::string isa_text(exec::cpu::isa level) {
  const auto& a = exec::cpu::amx();
  std::string s(exec::cpu::isa_name(level));
  if (level == exec::cpu::isa::avx512 && (a.bf16 || a.int8)) s += " with AMX (" + amx_text(level) + ")";
  return s;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct batch_figures {
  double decode_tok_s = 0;   // aggregate over the sequences, rounds with no prefill only
  double prefill_tok_s = 0;  // aggregate over the rounds that prefilled
  double host_share = 0;     // of the driver's round time, what was not inside the executor's steps
};

// `batch` sequences of prompt_len tokens decode gen tokens each through the driver; medians over runs.
result<batch_figures, std::string> drive_batch(std::shared_ptr<const families::model_handle> h, exec::executor& ex,
                                               const bench_options& o, std::int64_t batch, std::int64_t chain = 1) {
  driver::driver_options opt;
  opt.chain_steps = chain;
  opt.max_rows = batch;
  opt.capacity = o.prompt_len + o.gen;
  opt.block_size = 16;
  opt.prefill_chunk = std::min<std::int64_t>(o.prompt_len, 512);
  // Every prompt is taken in the first round, so the sequences decode in lockstep from the second, all
  // `batch` rows in every decode round, as llama-batched-bench's S_TG measures. (A budget of one chunk
  // staggered the starts by a round each, and the last rounds decoded 15, 14, ... rows in the steps of
  // 16.)
  opt.token_budget = batch * opt.prefill_chunk + batch;
  opt.prefix_cache = false;  // distinct prompts anyway; keep the figure about compute
  auto prepared = driver::driver<driver::unprepared>(h, ex, opt).prepare();
  if (!prepared) return unexpected("prepare: " + prepared.error().second.message());
  auto& d = *prepared;
  const auto vocab = h->model().config().vocab;
  std::vector<double> dec, pre;
  for (int rep = 0; rep < o.runs + 1; ++rep) {  // the first run warms caches and pages
    for (std::int64_t b = 0; b < batch; ++b) {
      driver::seq_request r;
      for (std::int64_t i = 0; i < o.prompt_len; ++i)
        r.prompt.push_back(static_cast<std::int32_t>(3 + (i * 7919 + b * 104729 + rep * 31) % (vocab - 3)));
      r.max_tokens = o.gen;
      r.ignore_eos = true;
      if (auto id = d.open(std::move(r)); !id) return unexpected("open: " + id.error().message());
    }
    double dec_s = 0, pre_s = 0;
    std::int64_t dec_n = 0, pre_n = 0;
    while (!d.idle()) {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = d.step();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!r) return unexpected("step: " + r.error().message());
      if (r->prefill_tokens > 0) {
        pre_s += s;
        pre_n += r->prefill_tokens;
      } else {
        dec_s += s;
        dec_n += r->decode_rows;
      }
      for (const auto& u : r->updates)
        if (u.finished) (void)d.release(u.id);
    }
    if (rep == 0) continue;
    if (dec_s > 0) dec.push_back(static_cast<double>(dec_n) / dec_s);
    if (pre_s > 0) pre.push_back(static_cast<double>(pre_n) / pre_s);
  }
  const auto c = d.counters();
  return batch_figures{median_of(dec), median_of(pre), c.round_seconds > 0 ? 1.0 - c.executor_seconds / c.round_seconds : 0.0};
}

// --chain K: the same sequences decoded with and without chained decode (K steps per executor call),
// both in this run: tokens/s and the host's share of the driver's time.
int run_chain_bench(const bench_options& o, std::shared_ptr<const families::model_handle> h) {
  exec::cpu::cpu_executor ex({o.threads, std::nullopt});
  auto off = drive_batch(h, ex, o, o.batch, 1);
  auto on = drive_batch(h, ex, o, o.batch, o.chain);
  if (!off || !on) {
    std::fprintf(stderr, "troupe bench: %s\n", (!off ? off.error() : on.error()).c_str());
    return 1;
  }
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["threads"] = ex.threads();
    j["batch"] = o.batch;
    j["chain"] = o.chain;
    j["decode_tok_s_unchained"] = off->decode_tok_s;
    j["decode_tok_s_chained"] = on->decode_tok_s;
    j["host_share_unchained"] = off->host_share;
    j["host_share_chained"] = on->host_share;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s, %d threads, %lld sequences, chains of %lld steps\n", o.model.c_str(), ex.threads(), static_cast<long long>(o.batch),
                static_cast<long long>(o.chain));
    std::printf("decode one step a round: %.1f tok/s, host share %.1f%%\n", off->decode_tok_s, 100.0 * off->host_share);
    std::printf("decode chained:          %.1f tok/s, host share %.1f%% (%.2fx)\n", on->decode_tok_s, 100.0 * on->host_share,
                off->decode_tok_s > 0 ? on->decode_tok_s / off->decode_tok_s : 0.0);
  }
  return 0;
}

int run_batch_bench(const bench_options& o, std::shared_ptr<const families::model_handle> h) {
  exec::cpu::cpu_executor ex({o.threads, std::nullopt});
  auto one = drive_batch(h, ex, o, 1);
  exec::cpu::cpu_executor ex_n({o.threads, std::nullopt});
  auto many = drive_batch(h, ex_n, o, o.batch);
  if (!one || !many) {
    std::fprintf(stderr, "troupe bench: %s\n", (!one ? one.error() : many.error()).c_str());
    return 1;
  }
  const double ratio = one->decode_tok_s > 0 ? many->decode_tok_s / one->decode_tok_s : 0;
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["threads"] = ex.threads();
    j["isa"] = std::string(exec::cpu::isa_name(ex.level()));
    j["amx"] = amx_text(ex.level());
    j["batch"] = o.batch;
    j["prompt_len"] = o.prompt_len;
    j["gen"] = o.gen;
    j["decode_tok_s_batch1"] = one->decode_tok_s;
    j["decode_tok_s"] = many->decode_tok_s;
    j["decode_speedup"] = ratio;
    j["prefill_tok_s"] = many->prefill_tok_s;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s, %d threads, %s, driver with %lld rows\n", o.model.c_str(), ex.threads(),
                isa_text(ex.level()).c_str(), static_cast<long long>(o.batch));
    std::printf("decode_tok_s %.2f aggregate over %lld sequences (batch 1: %.2f): %.2fx\n", many->decode_tok_s,
                static_cast<long long>(o.batch), one->decode_tok_s, ratio);
    std::printf("prefill_tok_s %.1f aggregate (prompt %lld each)\n", many->prefill_tok_s, static_cast<long long>(o.prompt_len));
  }
  return 0;
}

// --backend cuda: one device, the served path (driver, sampling on the device): prefill of one
// prompt_len prompt, decode at batch 1 and at --batch N, against the bound the device's copy bandwidth
// puts on decode at batch 1 (every weight byte read once per token).
int run_cuda_bench(const bench_options& o, std::shared_ptr<const families::model_handle> h) {
  exec::cuda::cuda_options co;
  co.device = o.device;
  auto devs = exec::cuda::devices();
  auto one_ex = exec::cuda::make_executor(co);
  if (!devs || !one_ex) {
    std::fprintf(stderr, "troupe bench: the cuda backend: %s\n", !devs ? devs.error().c_str() : one_ex.error().message().c_str());
    return 2;
  }
  auto one = drive_batch(h, **one_ex, o, 1);
  if (!one) {
    std::fprintf(stderr, "troupe bench: %s\n", one.error().c_str());
    return 1;
  }
  const double weight_bytes = static_cast<double>((*one_ex)->memory().weight_bytes);
  one_ex->reset();
  batch_figures many = *one;
  if (o.batch > 1) {
    auto many_ex = exec::cuda::make_executor(co);
    if (!many_ex) {
      std::fprintf(stderr, "troupe bench: %s\n", many_ex.error().message().c_str());
      return 1;
    }
    auto m = drive_batch(h, **many_ex, o, o.batch);
    if (!m) {
      std::fprintf(stderr, "troupe bench: %s\n", m.error().c_str());
      return 1;
    }
    many = *m;
  }
  auto bw = exec::cuda::copy_bandwidth(o.device);
  const double bw_b = bw ? *bw * 1e9 : 0;
  const double bound = weight_bytes > 0 ? bw_b / weight_bytes : 0;
  const auto& dev = (*devs)[static_cast<std::size_t>(o.device)];
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["device"] = dev.name;
    j["prompt_len"] = o.prompt_len;
    j["gen"] = o.gen;
    j["batch"] = o.batch;
    j["prefill_tok_s"] = one->prefill_tok_s;
    j["decode_tok_s_batch1"] = one->decode_tok_s;
    j["decode_tok_s"] = many.decode_tok_s;
    j["bandwidth_gb_s"] = bw_b / 1e9;
    j["weight_bytes"] = weight_bytes;
    j["decode_bound_tok_s"] = bound;
    j["decode_fraction_of_bound"] = bound > 0 ? one->decode_tok_s / bound : 0;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s on %s (sm_%d%d), driver with device sampling\n", o.model.c_str(), dev.name.c_str(), dev.major, dev.minor);
    std::printf("prefill_tok_s %.1f (prompt %lld)\ndecode_tok_s %.2f at batch 1, %.2f aggregate at batch %lld (%lld tokens each)\n",
                one->prefill_tok_s, static_cast<long long>(o.prompt_len), one->decode_tok_s, many.decode_tok_s,
                static_cast<long long>(o.batch), static_cast<long long>(o.gen));
    std::printf("bandwidth %.1f GB/s (device copy), weights %.1f MB: decode bound %.1f tok/s, batch-1 decode at %.0f%% of it\n",
                bw_b / 1e9, weight_bytes / 1e6, bound, bound > 0 ? 100.0 * one->decode_tok_s / bound : 0.0);
  }
  return 0;
}

// Times every collective of one rank: their share of that rank's step time (its own sums and copies
// and the wait for the other ranks).
class timed_collective final : public collective {
 public:
  explicit timed_collective(collective& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  result<void, std::string> all_reduce_sum(std::span<float> data) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = inner_.all_reduce_sum(data);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  result<void, std::string> all_gather(std::span<const float> mine, std::span<float> all) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = inner_.all_gather(mine, all);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  result<void, std::string> send(std::span<const float> data, int to) override { return inner_.send(data, to); }
  result<void, std::string> recv(std::span<float> data, int from) override { return inner_.recv(data, from); }
  double seconds = 0;

 private:
  collective& inner_;
};

struct tp_figures {
  double prefill_tok_s = 0, decode_tok_s = 0, reduce_share = 0;  // medians over runs; share of decode time
};

// One sequence (prompt_len, then gen decode steps) on `ranks` in-process ranks of `threads_per_rank`.
result<tp_figures, std::string> drive_tp(const std::shared_ptr<const families::model_handle>& h, const bench_options& o, int ranks,
                                         int threads_per_rank) {
  auto group = local_group(ranks);
  const auto vocab = h->model().config().vocab;
  std::vector<std::int32_t> prompt;
  for (std::int64_t i = 0; i < o.prompt_len; ++i) prompt.push_back(static_cast<std::int32_t>(3 + (i * 7919) % (vocab - 3)));
  std::vector<result<tp_figures, std::string>> out(static_cast<std::size_t>(ranks), unexpected(std::string("not run")));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      auto& res = out[static_cast<std::size_t>(r)];
      std::shared_ptr<const families::model_handle> shard = h;
      if (ranks > 1) {
        auto s = h->shard(r, ranks);
        if (!s) return void(res = unexpected(families::message(s.error())));
        shard = *s;
      }
      timed_collective timed(*group[static_cast<std::size_t>(r)]);
      exec::cpu::cpu_executor ex({threads_per_rank, std::nullopt, ranks > 1 ? &timed : nullptr});
      auto run = exec_runner::create(shard, ex, o.prompt_len + o.gen);
      if (!run) return void(res = unexpected(run.error()));
      for (auto p : {run->prepare(o.prompt_len, false), run->prepare(1, false)})
        if (!p) return void(res = unexpected(p.error()));
      std::vector<double> pre, dec, share;
      for (int rep = 0; rep < o.runs + 1; ++rep) {
        (void)run->reset();
        auto t0 = std::chrono::steady_clock::now();
        auto l = run->feed(prompt);
        if (!l) return void(res = unexpected(l.error()));
        const double pre_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        timed.seconds = 0;
        t0 = std::chrono::steady_clock::now();
        for (std::int64_t i = 0; i < o.gen; ++i) {
          const std::int32_t next[] = {static_cast<std::int32_t>(std::max_element(l->begin(), l->end()) - l->begin())};
          l = run->feed(next);
          if (!l) return void(res = unexpected(l.error()));
        }
        const double dec_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep == 0) continue;
        pre.push_back(static_cast<double>(o.prompt_len) / pre_s);
        dec.push_back(static_cast<double>(o.gen) / dec_s);
        share.push_back(timed.seconds / dec_s);
      }
      res = tp_figures{median_of(pre), median_of(dec), median_of(share)};
    });
  for (auto& t : threads) t.join();
  for (auto& r : out)
    if (!r) return unexpected(r.error());
  return out[0];
}

// What a split-replica run measured: the model, the sequence and the threads.
nlohmann::json run_json(const bench_options& o, int threads) {
  return {{"model", o.model}, {"prompt_len", o.prompt_len}, {"gen", o.gen}, {"threads", threads}};
}

int run_tp_bench(const bench_options& o, const std::shared_ptr<const families::model_handle>& h) {
  const int total = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int n = o.tensor_parallel;
  const int per_rank = std::max(1, total / n);
  auto one = drive_tp(h, o, 1, total);
  if (!one) {
    std::fprintf(stderr, "troupe bench: 1 rank: %s\n", one.error().c_str());
    return 1;
  }
  auto split = drive_tp(h, o, n, per_rank);
  if (!split) {
    std::fprintf(stderr, "troupe bench: %d ranks: %s\n", n, split.error().c_str());
    return 1;
  }
  if (o.json) {
    nlohmann::json j = run_json(o, total);
    j["ranks"] = {{{"ranks", 1}, {"threads_per_rank", total}, {"prefill_tok_s", one->prefill_tok_s}, {"decode_tok_s", one->decode_tok_s}},
                  {{"ranks", n}, {"threads_per_rank", per_rank}, {"prefill_tok_s", split->prefill_tok_s}, {"decode_tok_s", split->decode_tok_s},
                   {"collective_share_of_decode", split->reduce_share}}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s: prompt %lld, then %lld decode tokens; %d threads in all; medians of %d runs\n", o.model.c_str(),
              static_cast<long long>(o.prompt_len), static_cast<long long>(o.gen), total, o.runs);
  std::printf("ranks  threads/rank  prefill tok/s  decode tok/s  decode vs 1 rank  collective share of decode\n");
  std::printf("%5d  %12d  %13.1f  %12.2f  %16s  %26s\n", 1, total, one->prefill_tok_s, one->decode_tok_s, "1.00x", "-");
  char ratio[32], share[32];
  std::snprintf(ratio, sizeof ratio, "%.2fx", split->decode_tok_s / one->decode_tok_s);
  std::snprintf(share, sizeof share, "%.1f%%", 100 * split->reduce_share);
  std::printf("%5d  %12d  %13.1f  %12.2f  %16s  %26s\n", n, per_rank, split->prefill_tok_s, split->decode_tok_s, ratio, share);
  return 0;
}

// One sequence through the driver on a tp x pp replica (driver::cpu_replica): prefill of the prompt (one
// chunk), then `gen` decode steps; tokens per second, medians over the runs after a warm-up.
result<tp_figures, std::string> drive_replica(const std::shared_ptr<const families::model_handle>& h, const bench_options& o, int tp, int pp,
                                              int threads_per_rank) {
  auto replica = driver::cpu_replica::make(h, tp, pp, threads_per_rank);
  if (!replica) return unexpected(replica.error());
  driver::driver_options opt;
  (*replica)->attach(opt);
  opt.max_rows = 1;
  opt.block_size = 16;
  opt.capacity = (o.prompt_len + o.gen + 1 + 15) / 16 * 16;
  opt.prefill_chunk = o.prompt_len;
  opt.token_budget = o.prompt_len + 1;
  opt.prefix_cache = false;
  auto d = driver::driver<driver::unprepared>((*replica)->head(), (*replica)->head_executor(), opt).prepare();
  if (!d) return unexpected(d.error().second.message());
  const auto vocab = h->model().config().vocab;
  std::vector<double> pre, dec;
  for (int rep = 0; rep < o.runs + 1; ++rep) {
    driver::seq_request r;
    for (std::int64_t i = 0; i < o.prompt_len; ++i) r.prompt.push_back(static_cast<std::int32_t>(3 + (i * 7919 + rep) % (vocab - 3)));
    r.max_tokens = o.gen + 1;  // the prefill step's token, then gen decode steps
    r.ignore_eos = true;
    auto id = d->open(std::move(r));
    if (!id) return unexpected(id.error().message());
    auto t0 = std::chrono::steady_clock::now();
    double pre_s = 0;
    bool finished = false;
    while (!finished) {
      auto rep_or = d->step();
      if (!rep_or) return unexpected(rep_or.error().message());
      for (const auto& u : rep_or->updates) {
        if (u.id != *id) continue;
        if (pre_s == 0 && !u.tokens.empty()) {
          pre_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          t0 = std::chrono::steady_clock::now();
        }
        finished = finished || u.finished;
      }
    }
    const double dec_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (void)d->release(*id);
    if (rep == 0) continue;
    pre.push_back(static_cast<double>(o.prompt_len) / pre_s);
    dec.push_back(static_cast<double>(o.gen) / dec_s);
  }
  return tp_figures{median_of(pre), median_of(dec), 0};
}

int run_replica_bench(const bench_options& o, const std::shared_ptr<const families::model_handle>& h) {
  const int total = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int tp = std::max(1, o.tensor_parallel), pp = std::max(1, o.pipeline_parallel);
  const int per_rank = std::max(1, total / (tp * pp));
  auto one = drive_replica(h, o, 1, 1, total);
  if (!one) {
    std::fprintf(stderr, "troupe bench: 1 x 1: %s\n", one.error().c_str());
    return 1;
  }
  auto split = drive_replica(h, o, tp, pp, per_rank);
  if (!split) {
    std::fprintf(stderr, "troupe bench: %d x %d: %s\n", tp, pp, split.error().c_str());
    return 1;
  }
  if (o.json) {
    nlohmann::json j = run_json(o, total);
    j["replicas"] = {{{"tensor_parallel", 1}, {"pipeline_parallel", 1}, {"threads_per_rank", total}, {"prefill_tok_s", one->prefill_tok_s},
                      {"decode_tok_s", one->decode_tok_s}},
                     {{"tensor_parallel", tp}, {"pipeline_parallel", pp}, {"threads_per_rank", per_rank}, {"prefill_tok_s", split->prefill_tok_s},
                      {"decode_tok_s", split->decode_tok_s}}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s: prompt %lld, then %lld decode tokens through the driver; %d threads in all; medians of %d runs\n", o.model.c_str(),
              static_cast<long long>(o.prompt_len), static_cast<long long>(o.gen), total, o.runs);
  std::printf("tp x pp  threads/rank  prefill tok/s  decode tok/s  decode vs 1 x 1\n");
  std::printf("%2d x %-2d  %12d  %13.1f  %12.2f  %15s\n", 1, 1, total, one->prefill_tok_s, one->decode_tok_s, "1.00x");
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2fx", split->decode_tok_s / one->decode_tok_s);
  std::printf("%2d x %-2d  %12d  %13.1f  %12.2f  %15s\n", tp, pp, per_rank, split->prefill_tok_s, split->decode_tok_s, ratio);
  return 0;
}

}  // namespace

// One sequence through the driver with and without speculation, alternating within each run so both
// see the same machine; decode is timed from the first token to the last.
int run_spec_bench(const bench_options& o, const std::shared_ptr<const families::model_handle>& h) {
  auto spec = speculation_of(o.speculation);
  if (!spec) {
    std::fprintf(stderr, "troupe bench: %s\n", spec.error().c_str());
    return 2;
  }
  exec::cpu::cpu_executor ex({o.threads, std::nullopt});
  driver::driver_options opt;
  opt.max_rows = 1;
  opt.block_size = 16;
  opt.capacity = (o.prompt_len + o.gen + spec->tokens + 1 + 15) / 16 * 16;
  opt.prefill_chunk = std::min<std::int64_t>(o.prompt_len, 512);
  opt.token_budget = opt.prefill_chunk + 1;
  opt.prefix_cache = false;
  auto plain = driver::driver<driver::unprepared>(h, ex, opt).prepare();
  if (!plain) {
    std::fprintf(stderr, "troupe bench: %s\n", plain.error().second.message().c_str());
    return 1;
  }
  opt.speculation = *spec;
  auto fast = driver::driver<driver::unprepared>(h, ex, opt).prepare();
  if (!fast) {
    std::fprintf(stderr, "troupe bench: %s\n", fast.error().second.message().c_str());
    return 1;
  }
  const auto vocab = h->model().config().vocab;
  std::vector<std::int32_t> prompt;
  for (std::int64_t i = 0; i < o.prompt_len; ++i) {
    const std::int64_t j = o.prompt == "repetitive" ? i % 8 : i;
    prompt.push_back(static_cast<std::int32_t>(3 + (j * 7919) % (vocab - 3)));
  }
  struct figures {
    std::vector<double> tok_s;
    std::vector<double> first_ms;  // the prompt's time to the first token (a draft model prefills it too)
    std::vector<std::int32_t> tokens;
  } off, on;
  auto once = [&](driver::driver<driver::serving>& d, figures& f, bool keep) -> result<void, std::string> {
    driver::seq_request r;
    r.prompt = prompt;
    r.max_tokens = o.gen;
    r.ignore_eos = true;
    std::vector<std::int32_t> toks;
    std::optional<std::chrono::steady_clock::time_point> first;
    const auto start = std::chrono::steady_clock::now();
    auto g = d.generate(std::move(r), [&](const driver::seq_update& u) {
      if (!u.tokens.empty() && !first) first = std::chrono::steady_clock::now();
    });
    if (!g) return unexpected(g.error().message());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - *first).count();
    if (keep) {
      f.tok_s.push_back(static_cast<double>(g->tokens.size() - 1) / s);
      f.first_ms.push_back(1e3 * std::chrono::duration<double>(*first - start).count());
    }
    f.tokens = g->tokens;
    return {};
  };
  const auto before = fast->counters();
  for (int rep = 0; rep < o.runs + 1; ++rep)
    for (auto* m : {&off, &on})
      if (auto r = once(m == &off ? *plain : *fast, *m, rep > 0); !r) {
        std::fprintf(stderr, "troupe bench: %s\n", r.error().c_str());
        return 1;
      }
  const auto c = fast->counters();
  const double drafted = static_cast<double>(c.draft_tokens - before.draft_tokens);
  const double accepted = static_cast<double>(c.accepted_tokens - before.accepted_tokens);
  const double verifies = static_cast<double>(c.verify_steps - before.verify_steps);
  const double t_off = median_of(off.tok_s), t_on = median_of(on.tok_s);
  const bool same = off.tokens == on.tokens;
  const std::string policy = std::string(driver::name(spec->kind)) + " K=" + std::to_string(spec->tokens) +
                             (spec->kind == driver::draft_kind::model ? " (" + o.speculation.draft_model + ")" : "");
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["policy"] = policy;
    j["prompt"] = o.prompt;
    j["prompt_len"] = o.prompt_len;
    j["gen"] = o.gen;
    j["threads"] = ex.threads();
    j["decode_tok_s_off"] = t_off;
    j["decode_tok_s_on"] = t_on;
    j["speedup"] = t_on / t_off;
    j["first_token_ms_off"] = median_of(off.first_ms);
    j["first_token_ms_on"] = median_of(on.first_ms);
    j["acceptance"] = drafted > 0 ? accepted / drafted : 0.0;
    j["tokens_per_verify"] = verifies > 0 ? (accepted + verifies) / verifies : 0.0;
    j["identical_tokens"] = same;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s, %s prompt of %lld tokens, %lld generated, %d threads, speculation %s\n", o.model.c_str(), o.prompt.c_str(),
                static_cast<long long>(o.prompt_len), static_cast<long long>(o.gen), ex.threads(), policy.c_str());
    std::printf("decode without drafts %.1f tok/s, with drafts %.1f tok/s: %.2fx\n", t_off, t_on, t_on / t_off);
    std::printf("first token after %.1f ms without drafts, %.1f ms with\n", median_of(off.first_ms), median_of(on.first_ms));
    std::printf("drafts accepted %.0f of %.0f (%.1f%%), %.2f tokens per verify step, tokens identical: %s\n", accepted, drafted,
                drafted > 0 ? 100.0 * accepted / drafted : 0.0, verifies > 0 ? (accepted + verifies) / verifies : 0.0, same ? "yes" : "NO");
  }
  return same ? 0 : 1;
}

int run_bench(const bench_options& o) {
  if (o.batch < 1) {
    std::fprintf(stderr, "troupe bench: --batch must be at least 1\n");
    return 2;
  }
  if (o.actors && o.backend != "cuda" && !o.speculation.any() && o.chain <= 1 && o.pipeline_parallel <= 1 && o.tensor_parallel <= 1)
    return through_cluster_module("bench", [&](const cluster_module_api& m) { return m.actor_bench(o); });
  auto loaded = families::model_handle::load(o.model, families::registry::builtin());
  if (!loaded) {
    std::fprintf(stderr, "troupe bench: %s\n", families::message(loaded.error()).c_str());
    return 2;
  }
  auto h = families::with_kv_type(*loaded, o.kv_type);
  if (!h) {
    std::fprintf(stderr, "troupe bench: %s\n", families::message(h.error()).c_str());
    return 2;
  }
  if (o.backend == "cuda") return run_cuda_bench(o, *h);
  if (o.speculation.any()) return run_spec_bench(o, *h);
  if (o.chain > 1) return run_chain_bench(o, *h);
  if (o.pipeline_parallel > 1) return run_replica_bench(o, *h);
  if (o.tensor_parallel > 1) return run_tp_bench(o, *h);
  if (o.batch > 1) return run_batch_bench(o, *h);
  exec::cpu::cpu_executor ex({o.threads, std::nullopt});
  auto run = exec_runner::create(*h, ex, o.prompt_len + o.gen);
  if (!run) {
    std::fprintf(stderr, "troupe bench: %s\n", run.error().c_str());
    return 1;
  }
  const auto vocab = (*h)->model().config().vocab;
  std::vector<std::int32_t> prompt;
  for (std::int64_t i = 0; i < o.prompt_len; ++i) prompt.push_back(static_cast<std::int32_t>(3 + (i * 7919) % (vocab - 3)));
  for (auto r : {run->prepare(o.prompt_len, false), run->prepare(1, false)})
    if (!r) {
      std::fprintf(stderr, "troupe bench: %s\n", r.error().c_str());
      return 1;
    }
  std::vector<double> prefill, decode, bandwidth;
  for (int rep = 0; rep < o.runs + 1; ++rep) {  // the first run warms caches and pages
    (void)run->reset();
    const auto t0 = std::chrono::steady_clock::now();
    auto l = run->feed(prompt);
    const auto t1 = std::chrono::steady_clock::now();
    if (!l) {
      std::fprintf(stderr, "troupe bench: %s\n", l.error().c_str());
      return 1;
    }
    std::int32_t next = static_cast<std::int32_t>(std::max_element(l->begin(), l->end()) - l->begin());
    for (std::int64_t i = 0; i < o.gen; ++i) {
      auto d = run->feed(std::span(&next, 1));
      if (!d) {
        std::fprintf(stderr, "troupe bench: %s\n", d.error().c_str());
        return 1;
      }
      next = static_cast<std::int32_t>(std::max_element(d->begin(), d->end()) - d->begin());
    }
    const auto t2 = std::chrono::steady_clock::now();
    if (rep == 0) continue;
    prefill.push_back(static_cast<double>(o.prompt_len) / std::chrono::duration<double>(t1 - t0).count());
    decode.push_back(static_cast<double>(o.gen) / std::chrono::duration<double>(t2 - t1).count());
    // The machine's read bandwidth right after this run's decode: on a shared VM it moves by half
    // between minutes, so each run is held against its own sample.
    bandwidth.push_back(measure_read_bandwidth(std::size_t{1} << 30, ex.threads()));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Bytes a decode step must read: every weight once (the embedding only for one row).
  const double model_bytes = static_cast<double>(ex.memory().weight_bytes);
  std::vector<double> fractions;
  for (std::size_t r = 0; r < decode.size(); ++r) fractions.push_back(decode[r] * model_bytes / bandwidth[r]);
  // A routed model's decode reads only the selected experts: the bound is on the active bytes (the
  // packed bytes scaled by the stored active share).
  const auto fp = families::footprint((*h)->model());
  const double active_bytes = fp.bytes > 0 ? model_bytes * fp.active_bytes / fp.bytes : model_bytes;
  if (active_bytes < model_bytes) {
    fractions.clear();
    for (std::size_t r = 0; r < decode.size(); ++r) fractions.push_back(decode[r] * active_bytes / bandwidth[r]);
  }
  const double bw = median(bandwidth);
  const double bound = bw / active_bytes;
  const double p = median(prefill), d = median(decode), fraction = median(fractions);
  // What a sequence carries: KV bytes per token (attention layers) and bytes per sequence (recurrent
  // layers' conv windows and scan states, whatever its length).
  const auto carried = families::state_bytes((*h)->model());
  const std::int64_t kv_per_token = carried.per_token, state_per_sequence = carried.per_sequence;
  // Sequences of this run's length (prompt and output) whose KV and state fit in 1 GiB.
  const std::int64_t per_sequence = kv_per_token * (o.prompt_len + o.gen) + state_per_sequence;
  const std::int64_t fit_per_gib = per_sequence > 0 ? (std::int64_t{1} << 30) / per_sequence : 0;
  const std::string kv_name(name((*h)->model().kv_type()));
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["threads"] = ex.threads();
    j["isa"] = std::string(exec::cpu::isa_name(ex.level()));
    j["amx"] = amx_text(ex.level());
    j["prompt_len"] = o.prompt_len;
    j["gen"] = o.gen;
    j["prefill_tok_s"] = p;
    j["decode_tok_s"] = d;
    j["bandwidth_gb_s"] = bw / 1e9;
    j["weight_bytes"] = model_bytes;
    j["active_weight_bytes"] = active_bytes;
    j["params"] = fp.params;
    j["active_params"] = fp.active_params;
    j["experts"] = (*h)->model().config().experts;
    j["decode_bound_tok_s"] = bound;
    j["decode_fraction_of_bound"] = fraction;
    j["kv_type"] = kv_name;
    j["kv_bytes_per_token"] = kv_per_token;
    j["sequences_per_gib"] = fit_per_gib;
    j["recurrent_bytes_per_sequence"] = state_per_sequence;
    j["bandwidth_gb_s_min"] = *std::min_element(bandwidth.begin(), bandwidth.end()) / 1e9;
    j["bandwidth_gb_s_max"] = *std::max_element(bandwidth.begin(), bandwidth.end()) / 1e9;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s, %d threads, %s\n", o.model.c_str(), ex.threads(), isa_text(ex.level()).c_str());
    std::printf("prefill_tok_s %.1f (prompt %lld)\ndecode_tok_s %.2f (%lld tokens)\n", p, static_cast<long long>(o.prompt_len), d,
                static_cast<long long>(o.gen));
    std::printf("bandwidth %.1f GB/s (median of a sample after each run, %.1f-%.1f), weights %.1f MB: decode bound %.2f tok/s, "
                "decode at %.0f%% of it (median over runs, each against its own sample)\n",
                bw / 1e9, *std::min_element(bandwidth.begin(), bandwidth.end()) / 1e9, *std::max_element(bandwidth.begin(), bandwidth.end()) / 1e9,
                model_bytes / 1e6, bound, 100.0 * fraction);
    std::printf("state per sequence: KV (%s) %lld bytes per token, recurrent %lld bytes (conv windows and scan states, any length); "
                "%lld sequences of %lld positions fit in 1 GiB\n",
                kv_name.c_str(), static_cast<long long>(kv_per_token), static_cast<long long>(state_per_sequence),
                static_cast<long long>(fit_per_gib), static_cast<long long>(o.prompt_len + o.gen));
    if (active_bytes < model_bytes && (*h)->model().config().experts == 0)
      std::printf("the embedding table is read one row per token: %.1f MB read per decode step, the bound above is on these bytes\n",
                  active_bytes / 1e6);
    else if (active_bytes < model_bytes)
      std::printf("routed: %.1fM of %.1fM parameters active per token (%lld of %lld experts), %.1f MB read per decode step: "
                  "the bound above is on these bytes\n",
                  fp.active_params / 1e6, fp.params / 1e6, static_cast<long long>((*h)->model().config().experts_per_token),
                  static_cast<long long>((*h)->model().config().experts), active_bytes / 1e6);
  }
  return 0;
}

}  // namespace troupe::app

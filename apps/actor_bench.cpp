// troupe bench --actors (apps/actor_bench.hpp).
#include "apps/actor_bench.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "cluster/local_cluster.hpp"
#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"

namespace troupe::app {

namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// N jobs of prompt_len tokens generating gen tokens each: straight through a driver, then through a
// one-process actor cluster (coordinator, node, one driver replica, one client actor) with the same
// driver options. Wall time from the first submission to the last token, medians over runs.
int run_actor_bench(const bench_options& o) {
  auto loaded = families::model_handle::load(o.model, families::registry::builtin());
  if (!loaded) {
    std::fprintf(stderr, "troupe bench: %s\n", families::message(loaded.error()).c_str());
    return 2;
  }
  auto kv = families::with_kv_type(*loaded, o.kv_type);
  if (!kv) {
    std::fprintf(stderr, "troupe bench: %s\n", families::message(kv.error()).c_str());
    return 2;
  }
  const std::shared_ptr<const families::model_handle> h = *kv;
  driver::driver_options opt;
  opt.max_rows = o.batch;
  opt.capacity = o.prompt_len + o.gen;
  opt.block_size = 16;
  opt.prefill_chunk = std::min<std::int64_t>(o.prompt_len, 512);
  opt.token_budget = opt.prefill_chunk + o.batch;
  opt.prefix_cache = false;
  const auto vocab = h->model().config().vocab;
  auto prompt_of = [&](std::int64_t b, int rep) {
    std::vector<std::int32_t> p;
    for (std::int64_t i = 0; i < o.prompt_len; ++i) p.push_back(static_cast<std::int32_t>(3 + (i * 7919 + b * 104729 + rep * 31) % (vocab - 3)));
    return p;
  };
  std::vector<double> direct, actor;
  {
    exec::cpu::cpu_executor ex({o.threads, std::nullopt});
    auto d = driver::driver<driver::unprepared>(h, ex, opt).prepare();
    if (!d) {
      std::fprintf(stderr, "troupe bench: %s\n", d.error().second.message().c_str());
      return 1;
    }
    for (int rep = 0; rep < o.runs + 1; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (std::int64_t b = 0; b < o.batch; ++b) {
        driver::seq_request r;
        r.prompt = prompt_of(b, rep);
        r.max_tokens = o.gen;
        r.ignore_eos = true;
        (void)d->open(std::move(r));
      }
      while (!d->idle()) {
        auto r = d->step();
        if (!r) return 1;
        for (const auto& u : r->updates)
          if (u.finished) (void)d->release(u.id);
      }
      if (rep > 0) direct.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  {
    actors::cluster_options co;
    co.replicas = 1;
    co.driver = opt;
    co.executor_threads = o.threads;
    auto c = actors::local_cluster::start(o.model, co);
    if (!c) {
      std::fprintf(stderr, "troupe bench: %s\n", c.error().c_str());
      return 1;
    }
    auto cl = (*c)->connect();
    for (int rep = 0; rep < o.runs + 1; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<actors::job> jobs;
      for (std::int64_t b = 0; b < o.batch; ++b) {
        transport::job_submit j;
        j.prompt = prompt_of(b, rep);
        j.max_tokens = o.gen;
        j.ignore_eos = true;
        auto jb = cl->submit(j);
        if (!jb) {
          std::fprintf(stderr, "troupe bench: %s\n", jb.error().message.c_str());
          return 1;
        }
        jobs.push_back(std::move(*jb));
      }
      for (auto& j : jobs)
        if (j.wait().finish_reason != "length") return 1;
      if (rep > 0) actor.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  const double td = median_of(direct), ta = median_of(actor);
  const double tokens = static_cast<double>(o.batch * o.gen);
  const double added = 100.0 * (ta - td) / td;
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["jobs"] = o.batch;
    j["prompt_len"] = o.prompt_len;
    j["gen"] = o.gen;
    j["direct_s"] = td;
    j["actors_s"] = ta;
    j["direct_tok_s"] = tokens / td;
    j["actors_tok_s"] = tokens / ta;
    j["actors_jobs_s"] = static_cast<double>(o.batch) / ta;
    j["added_time_per_output_token_pct"] = added;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%lld jobs x (prompt %lld, gen %lld): driver directly %.3f s (%.1f tok/s), through the actors %.3f s (%.1f tok/s, %.2f jobs/s)\n",
                static_cast<long long>(o.batch), static_cast<long long>(o.prompt_len), static_cast<long long>(o.gen), td, tokens / td, ta,
                tokens / ta, static_cast<double>(o.batch) / ta);
    std::printf("the actor layer adds %.2f%% to the time per output token\n", added);
  }
  return 0;
}

}  // namespace troupe::app

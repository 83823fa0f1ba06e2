// A cluster in one process (coordinator, registry, one node, two driver replicas on CPU executors):
// concurrent jobs from several client actors give exactly the driver's own tokens; cancellation,
// deadlines, backpressure, bad requests and garbage bytes to every actor.
#include "cluster/local_cluster.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/tiny_model.hpp"
#include "transport/codec.hpp"
#include "tests/support/served_model.hpp"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

fs::path fixture_path() { return test::tiny_llama_gguf("llama.gguf"); }

cluster_options small_cluster() {
  cluster_options o;
  o.replicas = 2;
  o.driver.max_rows = 8;
  o.driver.capacity = 128;
  o.driver.block_size = 8;
  o.driver.prefill_chunk = 32;
  o.driver.token_budget = 64;
  o.executor_threads = 1;
  return o;
}

transport::job_submit job_for(int i) {
  transport::job_submit j;
  std::vector<std::int32_t> ids;
  for (int t = 0; t < 5 + i % 23; ++t) ids.push_back(3 + (t * 31 + i * 17) % 500);
  j.prompt = ids;
  j.max_tokens = 6 + i % 7;
  j.ignore_eos = true;
  if (i % 2) {
    j.sampling.temperature = 0.8f;
    j.sampling.top_p = 0.9f;
    j.sampling.seed = 1000 + static_cast<std::uint64_t>(i);
  }
  if (i % 5 == 0) j.sampling.top_logprobs = 2;
  return j;
}

// The same request through a driver alone.
std::vector<std::int32_t> alone(driver::driver<driver::serving>& d, const transport::job_submit& j) {
  driver::seq_request r;
  r.prompt = std::get<std::vector<std::int32_t>>(j.prompt);
  r.max_tokens = j.max_tokens;
  r.ignore_eos = j.ignore_eos;
  r.sampling.temperature = j.sampling.temperature;
  r.sampling.top_p = j.sampling.top_p;
  r.sampling.seed = j.sampling.seed;
  auto g = d.generate(r);
  EXPECT_TRUE(g) << (g ? "" : g.error().message());
  return g ? g->tokens : std::vector<std::int32_t>{};
}

TEST(cluster, concurrent_jobs_from_eight_clients_match_the_driver_alone) {
  auto c = local_cluster::start(fixture_path(), small_cluster());
  ASSERT_TRUE(c) << c.error();
  auto& cluster = **c;

  auto h = test::served_model(fixture_path());
  ASSERT_TRUE(h);
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto ref = driver::driver<driver::unprepared>(h, ex, small_cluster().driver).prepare();
  ASSERT_TRUE(ref);

  constexpr int clients = 8, per_client = 8;
  std::vector<job_result> results(clients * per_client);
  std::vector<std::thread> threads;
  for (int k = 0; k < clients; ++k) {
    threads.emplace_back([&, k] {
      auto cl = cluster.connect();
      std::vector<job> jobs;
      for (int i = 0; i < per_client; ++i) {
        auto jb = cl->submit(job_for(k * per_client + i));
        EXPECT_TRUE(jb) << (jb ? "" : jb.error().message);
        if (jb) jobs.push_back(std::move(*jb));
      }
      for (int i = 0; i < static_cast<int>(jobs.size()); ++i) results[static_cast<std::size_t>(k * per_client + i)] = jobs[static_cast<std::size_t>(i)].wait();
    });
  }
  for (auto& t : threads) t.join();

  for (int i = 0; i < clients * per_client; ++i) {
    SCOPED_TRACE("job " + std::to_string(i));
    const auto& r = results[static_cast<std::size_t>(i)];
    EXPECT_FALSE(r.error) << (r.error ? r.error->message : "");
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.tokens, alone(*ref, job_for(i)));
    EXPECT_EQ(r.usage.completion_tokens, static_cast<std::int64_t>(r.tokens.size()));
    if (job_for(i).sampling.top_logprobs > 0) {
      ASSERT_EQ(r.logprobs.size(), r.tokens.size());
      for (const auto& lp : r.logprobs) EXPECT_EQ(lp.top.size(), 2u);
    }
  }
  const auto per_replica = cluster.replica_stats();
  ASSERT_EQ(per_replica.size(), 2u);
  std::int64_t done = 0;
  for (const auto& s : per_replica) {
    done += s.jobs_done;
    EXPECT_GT(s.jobs_done, 0) << "both replicas serve";
    EXPECT_EQ(s.kv_blocks_used, 0);
  }
  EXPECT_EQ(done, clients * per_client);
}

TEST(cluster, cancelled_jobs_stop_within_a_step_and_free_their_blocks) {
  auto o = small_cluster();
  o.driver.prefix_cache = false;
  o.driver.capacity = 2048;  // long jobs, so each is still running when its cancellation arrives
  auto c = local_cluster::start(fixture_path(), o);
  ASSERT_TRUE(c) << c.error();
  auto cl = (*c)->connect();
  std::vector<job> jobs;
  for (int i = 0; i < 4; ++i) {
    auto j = job_for(i);
    j.max_tokens = 2000;
    auto jb = cl->submit(j);
    ASSERT_TRUE(jb);
    jobs.push_back(std::move(*jb));
  }
  for (auto& j : jobs) {
    auto first = j.next();
    ASSERT_TRUE(first);
    j.cancel();
  }
  for (auto& j : jobs) {
    auto r = j.wait();
    EXPECT_EQ(r.finish_reason, "cancelled");
    EXPECT_LT(r.tokens.size(), 2000u);
  }
  for (const auto& s : (*c)->replica_stats()) {
    EXPECT_EQ(s.kv_blocks_used, 0);
    EXPECT_EQ(s.running + s.queued, 0);
  }
}

TEST(cluster, deadlines_end_jobs) {
  auto c = local_cluster::start(fixture_path(), small_cluster());
  ASSERT_TRUE(c) << c.error();
  auto cl = (*c)->connect();
  auto j = job_for(3);
  j.max_tokens = 120;
  j.deadline_ms = 1;
  auto jb = cl->submit(j);
  ASSERT_TRUE(jb);
  auto r = jb->wait();
  EXPECT_EQ(r.finish_reason, "deadline");
  EXPECT_LT(r.tokens.size(), 120u);
}

TEST(cluster, admission_limits_refuse_excess_jobs_at_once) {
  auto o = small_cluster();
  o.max_outstanding = 2;
  o.driver.capacity = 2048;
  auto c = local_cluster::start(fixture_path(), o);
  ASSERT_TRUE(c) << c.error();
  auto cl = (*c)->connect();
  std::vector<job> admitted;
  int overloaded = 0;
  for (int i = 0; i < 10; ++i) {
    auto j = job_for(i);
    j.max_tokens = 2000;  // long enough to outlive the burst of submissions
    auto jb = cl->submit(j);
    if (jb) {
      admitted.push_back(std::move(*jb));
    } else {
      EXPECT_EQ(jb.error().code, transport::error_code::overloaded);
      EXPECT_EQ(jb.error().retry, transport::retry::overloaded);
      ++overloaded;
    }
  }
  EXPECT_EQ(admitted.size(), 2u);
  EXPECT_EQ(overloaded, 8);
  for (auto& j : admitted) {
    j.cancel();
    EXPECT_EQ(j.wait().finish_reason, "cancelled");
  }
  EXPECT_GE((*c)->stats().jobs_refused, overloaded);
}

TEST(cluster, bad_requests_get_typed_errors) {
  auto c = local_cluster::start(fixture_path(), small_cluster());
  ASSERT_TRUE(c) << c.error();
  auto cl = (*c)->connect();
  auto unknown = job_for(1);
  unknown.model = "no-such-model";
  auto u = cl->submit(unknown);
  ASSERT_FALSE(u);
  EXPECT_EQ(u.error().code, transport::error_code::unknown_model);

  auto out_of_vocab = job_for(1);
  out_of_vocab.prompt = std::vector<std::int32_t>{1, 2, 100000};
  auto jb = cl->submit(out_of_vocab);
  ASSERT_TRUE(jb);  // admitted by the coordinator, refused by the driver's admission
  auto r = jb->wait();
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->code, transport::error_code::bad_request);

  auto too_long = job_for(1);
  too_long.max_tokens = 100000;
  auto r2 = cl->submit(too_long)->wait();
  ASSERT_TRUE(r2.error);
  EXPECT_EQ(r2.error->code, transport::error_code::too_long);

  // A text prompt goes through the model's tokenizer.
  auto text = job_for(2);
  text.prompt = std::string("w300 w301 w302");
  auto r3 = cl->submit(text)->wait();
  EXPECT_FALSE(r3.error) << (r3.error ? r3.error->message : "");
  EXPECT_EQ(r3.finish_reason, "length");
}

TEST(cluster, every_actor_survives_garbage) {
  auto c = local_cluster::start(fixture_path(), small_cluster());
  ASSERT_TRUE(c) << c.error();
  auto cl = (*c)->connect();
  const std::string garbage[] = {"", "1234567", std::string(64, '\xff'), std::string(4096, '\0'),
                                 transport::encode(transport::stats{}),  // a valid envelope of the wrong kind
                                 std::string(1 << 20, 'x')};
  for (const auto* actor : {"coordinator", "registry", "node", "driver", "client"})
    for (const auto& g : garbage) EXPECT_TRUE((*c)->poke(actor, g)) << actor;
  auto r = cl->submit(job_for(4))->wait();
  EXPECT_FALSE(r.error);
  EXPECT_EQ(r.finish_reason, "length");
}

// The deployment's KV cache type reaches its replicas (the node types the handle it serves): a q8_0
// cache's tokens are a driver's over the q8_0-typed model, greedy and sampled; the status names the
// type and sizes the pool at it; an unknown type is refused at deploy by name.
TEST(cluster, a_deployments_kv_type_reaches_its_replicas) {
  auto o = small_cluster();
  o.replicas = 1;
  o.kv_type = "q8_0";
  auto c = local_cluster::start(fixture_path(), o);
  ASSERT_TRUE(c) << c.error();
  auto h = families::model_handle::load(fixture_path(), families::registry::builtin());
  ASSERT_TRUE(h);
  auto typed = families::with_kv_type(*h, dtype::q8_0);
  ASSERT_TRUE(typed);
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto ref = driver::driver<driver::unprepared>(*typed, ex, o.driver).prepare();
  ASSERT_TRUE(ref);
  auto cl = (*c)->connect();
  for (int i : {0, 1, 4}) {
    auto jb = cl->submit(job_for(i));
    ASSERT_TRUE(jb) << jb.error().message;
    const auto r = jb->wait();
    EXPECT_FALSE(r.error) << (r.error ? r.error->message : "");
    EXPECT_EQ(r.tokens, alone(*ref, job_for(i))) << "job " << i;
  }
  const auto st = (*c)->cluster_status();
  ASSERT_TRUE(st);
  ASSERT_EQ(st->deployments.size(), 1u);
  const auto& d = st->deployments[0];
  EXPECT_EQ(d.kv_type, "q8_0");
  // The tiny llama's per-layer KV row (2 x kv_heads x head_dim values) at 34 bytes per 32, every layer.
  const auto& cfg = (*h)->model().config();
  EXPECT_EQ(d.kv_bytes_per_token, cfg.kv_elems_per_token_per_layer / 32 * 34 * cfg.layers);
  EXPECT_EQ(d.capacity, 128);
  EXPECT_EQ(d.kv_tokens, 8 * 128);

  auto bad = small_cluster();
  bad.kv_type = "q4_0";
  auto refused = local_cluster::start(fixture_path(), bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().find("kv_type 'q4_0'"), std::string::npos) << refused.error();
}

TEST(cluster, the_registry_resolves_without_loading) {
  auto c = local_cluster::start(fixture_path(), small_cluster());
  ASSERT_TRUE(c) << c.error();
  auto ok = (*c)->resolve(fixture_path());
  ASSERT_TRUE(ok) << ok.error();
  EXPECT_EQ(ok->rfind("llama ", 0), 0u);
  EXPECT_FALSE((*c)->resolve("/no/such/model.gguf"));
  auto bad = local_cluster::start("/no/such/model.gguf", small_cluster());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("unknown_model"), std::string::npos);
}

}  // namespace
}  // namespace troupe::actors

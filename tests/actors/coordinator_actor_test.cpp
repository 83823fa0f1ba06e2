// The coordinator actor on CAF's deterministic test coordinator: its nodes, registry and drivers are
// scripted stand-ins, every message is delivered by the test (sched.run()), and the clock moves only
// when the test advances it. So each test says which message the coordinator must send in answer to
// which, with no wall clock involved: replicas spread over the nodes, a deploy answered once its
// replicas serve, a failed prepare that fails the deploy by name and leaves the cluster as it was,
// a lost node's replicas replaced elsewhere, a refusing node left alone for the backoff, jobs routed
// by model only.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor_internals.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {
namespace {

// What the stand-ins saw.
struct world {
  std::map<std::string, int> deploys;                  // node id -> deploy requests it got
  std::map<std::string, std::string> prepare_error;    // node id -> what its drivers answer ("" prepared)
  std::map<std::string, std::vector<caf::actor>> drivers;  // node id -> drivers it spawned
  std::map<std::string, int> stopped;                  // node id -> its drivers that quit
  std::map<std::string, std::vector<std::string>> submitted;  // node id -> models of the jobs its drivers got
  std::vector<std::string> replies;                    // answers to the test's requests, in order
  std::map<std::string, transport::load_request> loads;  // node id -> the last load it was asked for
  std::map<std::string, bool> hangs;                   // node id -> its drivers never answer a probe (a stuck step)
};

caf::behavior fake_driver(caf::event_based_actor* self, std::shared_ptr<world> w, std::string node) {
  self->attach_functor([w, node](const caf::error&) { ++w->stopped[node]; });
  return {
      [=](submit_atom, const std::string& bytes, const caf::actor&) {
        auto m = transport::decode(bytes);
        w->submitted[node].push_back(m && std::holds_alternative<transport::job_submit>(*m) ? std::get<transport::job_submit>(*m).model : "?");
      },
      [=](stop_atom) { self->quit(); },
      [=](stats_atom) -> caf::result<std::string> {
        if (w->hangs[node]) return self->make_response_promise<std::string>();  // never delivered: stuck
        return transport::encode(transport::stats{});
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

// A node: for each deploy, a driver that registers at once (or answers its node's prepare_error).
caf::behavior fake_node(caf::event_based_actor* self, std::shared_ptr<world> w, std::string id) {
  return {
      [=](deploy_atom, const std::string& bytes, const caf::actor& coordinator) {
        ++w->deploys[id];
        auto m = transport::decode(bytes);
        const auto replica = m && std::holds_alternative<transport::deploy>(*m) ? std::get<transport::deploy>(*m).load.replica_id : 0;
        if (m && std::holds_alternative<transport::deploy>(*m)) w->loads[id] = std::get<transport::deploy>(*m).load;
        auto driver = self->spawn(fake_driver, w, id);
        w->drivers[id].push_back(driver);
        const auto why = w->prepare_error[id];
        self->send(coordinator, register_atom::value, replica, driver, why);
        if (!why.empty()) self->send_exit(driver, caf::exit_reason::user_shutdown);
        return caf::make_message(driver, std::string());
      },
      [](held_atom) { return caf::make_message(std::vector<caf::actor>{}, std::vector<std::string>{}); },  // runs nothing yet
      [](ping_atom) { return ping_atom::value; },
  };
}

registry_actor::behavior_type fake_registry(registry_actor::pointer, std::string) {
  return {
      [](ping_atom) { return ping_atom::value; },
      [](resolve_atom, const std::string& path) {
        transport::resolved_model r;
        r.path = path;
        r.family = "llama";
        if (path.find("missing") != std::string::npos) r.error = "no such file";
        if (path.find("big") != std::string::npos) {  // 8 layers of 1 GiB: needs two 6 GiB GPUs
          r.plannable = true;
          r.max_positions = 4096;
          r.layers = 8;
          r.layer_bytes = 1ull << 30;
          r.embedding_bytes = r.head_bytes = 256ull << 20;
          r.kv_bytes_per_token_per_layer = 4096;
          r.scratch_bytes = 64ull << 20;
          r.heads = 16;
          r.kv_heads = 8;
        }
        return transport::encode(r);
      },
  };
}

struct coordinator_test : ::testing::Test {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  std::shared_ptr<world> w = std::make_shared<world>();
  caf::actor coordinator;  // as peers hold it: untyped
  registry_actor registry;
  std::map<std::string, caf::actor> nodes;

  coordinator_test() {
    cfg.set("scheduler.policy", caf::atom("testing"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    registry = sys->spawn(fake_registry, std::string("registry"));
    coordinator = caf::actor_cast<caf::actor>(spawn_coordinator(*sys, registry, caf::actor{}, 1024, 256, {}, std::chrono::seconds(10)));
    sched->run();
  }
  ~coordinator_test() override {
    // Every actor quits before the system goes (its destructor waits for them, and only the test
    // delivers messages).
    for (auto& [id, n] : nodes) caf::anon_send_exit(n, caf::exit_reason::user_shutdown);
    for (auto& [id, ds] : w->drivers)
      for (auto& d : ds) caf::anon_send_exit(d, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(registry, caf::exit_reason::user_shutdown);
    sched->run();
  }

  // Sends `args` as a request to the coordinator from a one-shot actor and records the string answer.
  template <class... Ts>
  void ask(Ts... args) {
    auto w_ = w;
    auto c = coordinator;
    sys->spawn([=](caf::event_based_actor* self) {
      self->request(c, std::chrono::seconds(600), args...).then([=](const std::string& answer) { w_->replies.push_back(answer); },
                                                                 [=](caf::error&) { w_->replies.push_back("request failed"); });
    });
    sched->run();
  }
  void join(const std::string& id, std::vector<transport::device> devices = {{"cpu:0", transport::device_kind::cpu, 0}}) {
    auto n = sys->spawn(fake_node, w, id);
    nodes[id] = n;
    const auto inv = transport::encode(transport::inventory{{transport::node_inventory{id, devices}}});
    ask(node_atom::value, id, n, std::int32_t{0}, inv);
    ASSERT_EQ(w->replies.back(), "") << "join of " << id;
  }
  std::string deploy(const std::string& name, const std::string& path, std::int32_t replicas) {
    transport::deploy d;
    d.model = name;
    d.replicas = replicas;
    d.load.model = path;
    ask(deploy_atom::value, transport::encode(d));
    return w->replies.back();
  }
  transport::cluster_status status() {
    ask(status_atom::value);
    return std::get<transport::cluster_status>(*transport::decode(w->replies.back()));
  }
  // The answer's error (code and message), or none when it is the deployment.
  std::optional<transport::error> error_of(const std::string& answer) {
    auto m = transport::decode(answer);
    EXPECT_TRUE(m);
    if (m && std::holds_alternative<transport::error>(*m)) return std::get<transport::error>(*m);
    return std::nullopt;
  }
  int serving() {
    int n = 0;
    for (const auto& r : status().replicas) n += r.state == transport::replica_state::serving;
    return n;
  }
};

TEST_F(coordinator_test, a_deploy_spreads_its_replicas_over_the_nodes_and_answers_once_they_serve) {
  for (auto id : {"n1", "n2", "n3"}) join(id);
  const auto answer = deploy("alpha", "/m/alpha.gguf", 2);
  ASSERT_FALSE(error_of(answer)) << error_of(answer)->message;
  EXPECT_EQ(std::get<transport::deploy>(*transport::decode(answer)).model, "alpha");
  EXPECT_EQ(w->deploys["n1"] + w->deploys["n2"] + w->deploys["n3"], 2);
  for (const auto& [id, n] : w->deploys) EXPECT_LE(n, 1) << id << " holds both replicas";
  EXPECT_EQ(serving(), 2);
  // The same deployment again changes nothing; a third replica goes to the node without one.
  ASSERT_FALSE(error_of(deploy("alpha", "/m/alpha.gguf", 2)));
  EXPECT_EQ(w->deploys["n1"] + w->deploys["n2"] + w->deploys["n3"], 2);
  ASSERT_FALSE(error_of(deploy("alpha", "/m/alpha.gguf", 3)));
  for (auto id : {"n1", "n2", "n3"}) EXPECT_EQ(w->deploys[id], 1) << id;
  // Another checkpoint under a taken name is refused by code.
  auto taken = error_of(deploy("alpha", "/m/other.gguf", 1));
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->code, transport::error_code::name_taken);
  // An unknown checkpoint fails at the registry, before any node is asked.
  auto unknown = error_of(deploy("", "/m/missing.gguf", 1));
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->code, transport::error_code::unknown_model);
  EXPECT_EQ(w->deploys["n1"] + w->deploys["n2"] + w->deploys["n3"], 3);
}

TEST_F(coordinator_test, a_replica_that_fails_to_prepare_fails_the_deploy_by_node_and_leaves_the_cluster_as_it_was) {
  join("n1");
  join("n2");
  ASSERT_FALSE(error_of(deploy("beta", "/m/beta", 1)));  // on n1
  w->prepare_error["n2"] = "capacity 65536 exceeds the model's 2048 positions";
  w->prepare_error["n1"] = "";
  const auto answer = error_of(deploy("alpha", "/m/alpha.gguf", 2));
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->code, transport::error_code::prepare_failed);
  EXPECT_NE(answer->message.find("node 'n2'"), std::string::npos) << answer->message;
  EXPECT_NE(answer->message.find("exceeds the model's 2048 positions"), std::string::npos) << answer->message;
  const auto st = status();
  EXPECT_EQ(st.nodes.size(), 2u);
  ASSERT_EQ(st.replicas.size(), 1u);  // beta's, untouched
  EXPECT_EQ(st.replicas[0].model, "beta");
  ASSERT_EQ(st.deployments.size(), 1u);
  EXPECT_EQ(st.deployments[0].name, "beta");
  // alpha's replica that did prepare (on n1, next to beta) was stopped with the deploy.
  EXPECT_EQ(w->stopped["n1"], 1);
}

TEST_F(coordinator_test, a_lost_nodes_replicas_are_replaced_on_nodes_with_room) {
  join("n1");
  join("n2");
  ASSERT_FALSE(error_of(deploy("alpha", "/m/alpha.gguf", 2)));
  ASSERT_EQ(w->deploys["n1"], 1);
  ASSERT_EQ(w->deploys["n2"], 1);
  join("n3");
  EXPECT_EQ(w->deploys["n3"], 0);  // nothing is missing
  caf::anon_send_exit(nodes["n1"], caf::exit_reason::kill);
  sched->run();
  EXPECT_EQ(w->deploys["n3"], 1);  // the replacement goes where alpha is not
  EXPECT_EQ(w->deploys["n2"], 1);
  const auto st = status();
  EXPECT_EQ(st.nodes.size(), 2u);
  EXPECT_EQ(serving(), 2);
}

TEST_F(coordinator_test, a_node_that_failed_a_replacement_is_asked_again_only_after_the_backoff) {
  join("n1");
  ASSERT_FALSE(error_of(deploy("alpha", "/m/alpha.gguf", 1)));
  w->prepare_error["n2"] = "out of memory";
  join("n2");
  caf::anon_send_exit(nodes["n1"], caf::exit_reason::kill);
  sched->run();
  EXPECT_EQ(w->deploys["n2"], 1);  // tried once, refused
  EXPECT_EQ(serving(), 0);
  for (int s = 0; s < 20; ++s) {  // the reconcile tick runs every second; the backoff holds for 30
    sched->advance_time(reconcile_interval);
    sched->run();
  }
  EXPECT_EQ(w->deploys["n2"], 1);
  w->prepare_error["n2"] = "";
  for (int s = 0; s < 12; ++s) {
    sched->advance_time(reconcile_interval);
    sched->run();
  }
  EXPECT_EQ(w->deploys["n2"], 2);
  EXPECT_EQ(serving(), 1);
}

TEST_F(coordinator_test, jobs_run_only_on_replicas_of_the_model_they_name) {
  join("n1");
  join("n2");
  ASSERT_FALSE(error_of(deploy("alpha", "/m/alpha.gguf", 1)));
  ASSERT_FALSE(error_of(deploy("beta", "/m/beta", 1)));
  auto submit = [&](const std::string& model) {
    transport::job_submit j;
    j.model = model;
    j.prompt = std::vector<std::int32_t>{1, 2, 3};
    auto w_ = w;
    auto c = coordinator;
    sys->spawn([=](caf::event_based_actor* self) {
      self->request(c, std::chrono::seconds(600), submit_atom::value, transport::encode(j), caf::actor{})
          .then([=](std::uint64_t id, const std::string& err, const std::string& routed) {
            w_->replies.push_back(id ? "routed " + routed : std::string(transport::name(std::get<transport::error>(*transport::decode(err)).code)));
          });
    });
    sched->run();
    return w->replies.back();
  };
  for (int i = 0; i < 6; ++i) EXPECT_EQ(submit(i % 2 ? "beta" : "alpha"), i % 2 ? "routed beta" : "routed alpha");
  EXPECT_EQ(submit("/m/beta"), "routed beta");  // the checkpoint's path names it too
  EXPECT_EQ(submit("gamma"), "unknown_model");
  EXPECT_EQ(submit(""), "unknown_model");  // two models: the job must name one
  std::vector<std::string> all;
  for (const auto& [node, models] : w->submitted) {
    for (const auto& m : models) EXPECT_EQ(m, models.front()) << node << " ran jobs of two models";
    all.insert(all.end(), models.begin(), models.end());
  }
  EXPECT_EQ(all.size(), 7u);
}

// GPU nodes declare their devices and free memory; a model one GPU cannot hold is planned as a
// tensor-parallel group over two GPUs of one node (NCCL between them), and the load names them.
TEST_F(coordinator_test, a_model_one_gpu_cannot_hold_is_split_over_a_nodes_gpus) {
  const std::uint64_t GiB = 1ull << 30;
  join("g1", {{"cuda:0", transport::device_kind::cuda, 6 * GiB}, {"cuda:1", transport::device_kind::cuda, 6 * GiB}});
  transport::deploy d;
  d.model = "big";
  d.replicas = 1;
  d.load.model = "/m/big";
  d.load.max_rows = 4;
  d.load.capacity = 1024;
  ask(deploy_atom::value, transport::encode(d));
  ASSERT_FALSE(error_of(w->replies.back())) << error_of(w->replies.back())->message;
  ASSERT_EQ(w->deploys["g1"], 1);
  EXPECT_EQ(w->loads["g1"].tensor_parallel, 2);
  EXPECT_EQ(w->loads["g1"].pipeline_parallel, 1);
  EXPECT_EQ(w->loads["g1"].device, "cuda:0,cuda:1");
  const auto st = status();
  ASSERT_EQ(st.replicas.size(), 1u);
  EXPECT_EQ(st.replicas[0].tensor_parallel, 2);
  ASSERT_EQ(st.nodes.size(), 1u);
  EXPECT_GT(st.nodes[0].committed_bytes, 8 * GiB);  // both GPUs hold their half
  // A second replica does not fit what is left: refused by code, the first untouched.
  auto second = error_of(deploy("big", "/m/big", 2));
  ASSERT_TRUE(second);
  EXPECT_EQ(second->code, transport::error_code::no_room);
  EXPECT_EQ(status().replicas.size(), 1u);
}

TEST_F(coordinator_test, a_taken_node_id_is_refused_by_name) {
  join("n1");
  auto twin = sys->spawn(fake_node, w, std::string("n1"));
  const auto inv = transport::encode(transport::inventory{{transport::node_inventory{"n1", {{"cpu:0", transport::device_kind::cpu, 0}}}}});
  ask(node_atom::value, std::string("n1"), twin, std::int32_t{0}, inv);
  EXPECT_NE(w->replies.back().find("'n1' is taken"), std::string::npos) << w->replies.back();
  ask(node_atom::value, std::string("n9"), twin, std::int32_t{0}, std::string("not an inventory"));
  EXPECT_NE(w->replies.back().find("Inventory"), std::string::npos) << w->replies.back();
  EXPECT_EQ(status().nodes.size(), 1u);
  caf::anon_send_exit(twin, caf::exit_reason::user_shutdown);
}

TEST_F(coordinator_test, a_replica_that_stops_making_progress_is_declared_hung_and_replaced) {
  join("n1");
  join("n2");
  w->hangs["n1"] = true;
  ASSERT_FALSE(error_of(deploy("alpha", "/m/alpha.gguf", 1)));
  const int on_n1 = w->deploys["n1"];
  const std::string stuck = on_n1 ? "n1" : "n2";
  if (!on_n1) w->hangs["n2"] = true, w->hangs["n1"] = false;
  // Probes every second; the stuck driver answers none, a live one every time.
  for (int s = 0; s < 9; ++s) {
    sched->advance_time(reconcile_interval);
    sched->run();
  }
  EXPECT_EQ(serving(), 1) << "declared hung before the progress timeout";
  for (int s = 0; s < 4; ++s) {
    sched->advance_time(reconcile_interval);
    sched->run();
  }
  const std::string other = stuck == "n1" ? "n2" : "n1";
  EXPECT_EQ(w->deploys[other], 1) << "a replacement on the other node";
  EXPECT_GE(w->stopped[stuck], 1) << "the hung replica is told to stop";
  const auto st = status();
  ASSERT_EQ(st.replicas.size(), 1u);
  EXPECT_EQ(st.replicas[0].nodes, std::vector<std::string>{other});
  // A live replica keeps answering and is left alone.
  for (int s = 0; s < 15; ++s) {
    sched->advance_time(reconcile_interval);
    sched->run();
  }
  EXPECT_EQ(w->deploys[other], 1);
  EXPECT_EQ(serving(), 1);
}

}  // namespace
}  // namespace troupe::actors

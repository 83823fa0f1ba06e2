// The node actor on CAF's test coordinator, with a scripted coordinator: a deployment it cannot load is
// answered with the reason; a replica whose driver fails to prepare reports it to the coordinator (by
// replica id, with the driver's reason) and the node keeps running and serving the replica it already
// had. The drivers prepare on their own threads (detached), so the test delivers messages until the
// coordinator's stand-in has heard from them, with a bound.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <chrono>
#include <thread>

#include "actors/actor_internals.hpp"
#include "tests/support/tiny_model.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {
namespace {

struct heard {
  std::vector<std::pair<std::uint64_t, std::string>> registered;  // (replica id, why)
  std::vector<std::string> answers;                               // the node's answers: why ("" ok)
  std::vector<caf::actor> drivers;
};

caf::behavior fake_coordinator(caf::event_based_actor*, std::shared_ptr<heard> h) {
  return {
      [=](register_atom, std::uint64_t replica, const caf::actor&, const std::string& why) { h->registered.emplace_back(replica, why); },
      [=](progress_atom, std::uint64_t, std::int64_t, std::int64_t) {},
      [=](done_atom, std::uint64_t) {},
  };
}

struct node_test : ::testing::Test {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  std::shared_ptr<heard> h = std::make_shared<heard>();
  caf::actor coordinator, node;

  node_test() {
    cfg.set("scheduler.policy", caf::atom("testing"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    coordinator = sys->spawn(fake_coordinator, h);
    node = caf::actor_cast<caf::actor>(spawn_node(*sys, 1, 16, 0));
    sched->run();
  }
  ~node_test() override {
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
    for (int i = 0; i < 50; ++i) {  // the detached drivers finish on their own threads
      sched->run();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  void deploy(const std::string& path, std::int64_t capacity, std::uint64_t replica) {
    transport::deploy d;
    d.model = "tiny";
    d.load.model = path;
    d.load.capacity = capacity;
    d.load.max_rows = 4;
    d.load.replica_id = replica;
    auto h_ = h;
    auto n = node;
    auto c = coordinator;
    sys->spawn([=](caf::event_based_actor* self) {
      self->request(n, std::chrono::seconds(600), deploy_atom::value, transport::encode(d), c)
          .then([=](const caf::actor& driver, const std::string& why) {
            h_->answers.push_back(why);
            if (driver) h_->drivers.push_back(driver);
          });
    });
    sched->run();
  }
  // Delivers messages until the coordinator's stand-in heard `n` registrations (at most 60 s).
  void until_registered(std::size_t n) {
    for (int i = 0; i < 6000 && h->registered.size() < n; ++i) {
      sched->run();
      if (h->registered.size() < n) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(h->registered.size(), n);
  }
  bool node_answers() {
    bool alive = false;
    auto n = node;
    sys->spawn([=, &alive](caf::event_based_actor* self) { self->request(n, std::chrono::seconds(5), ping_atom::value).then([&](ping_atom) { alive = true; }); });
    sched->run();
    return alive;
  }
};

TEST_F(node_test, a_checkpoint_it_cannot_load_is_answered_with_the_reason) {
  deploy("/no/such/model.gguf", 0, 1);
  ASSERT_EQ(h->answers.size(), 1u);
  EXPECT_FALSE(h->answers[0].empty());
  EXPECT_TRUE(h->drivers.empty());
  EXPECT_TRUE(node_answers());
}

TEST_F(node_test, a_replica_that_fails_to_prepare_is_reported_and_takes_nothing_with_it) {
  const auto path = test::tiny_llama_gguf();
  deploy(path.string(), 128, 7);  // prepares
  until_registered(1);
  EXPECT_EQ(h->registered[0], std::make_pair(std::uint64_t{7}, std::string()));
  deploy(path.string(), 1 << 20, 8);  // a capacity past the model's positions: prepare() refuses
  until_registered(2);
  EXPECT_EQ(h->registered[1].first, 8u);
  EXPECT_NE(h->registered[1].second.find("capacity"), std::string::npos) << h->registered[1].second;
  for (int i = 0; i < 20; ++i) {  // the failed driver's exit reaches the node
    sched->run();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(node_answers());
  // The first replica still serves.
  ASSERT_EQ(h->drivers.size(), 2u);
  bool alive = false;
  auto first = h->drivers[0];
  sys->spawn([=, &alive](caf::event_based_actor* self) { self->request(first, std::chrono::seconds(5), ping_atom::value).then([&](ping_atom) { alive = true; }); });
  for (int i = 0; i < 500 && !alive; ++i) {
    sched->run();
    if (!alive) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(alive);
}

}  // namespace
}  // namespace troupe::actors

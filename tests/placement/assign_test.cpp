// placement::assign_replica: where the coordinator puts one more replica. Anti-affinity before load,
// a whole replica on one node when one holds it, pipeline stages across nodes when none does, the KV
// pool fitted to what is left, the --max-replicas bound, explicit splits as given, and refusals.
#include <gtest/gtest.h>

#include "placement/assign.hpp"

namespace troupe::placement {
namespace {

constexpr std::uint64_t MiB = 1 << 20;

requirements small_model() {
  requirements r;
  r.layers = 4;
  r.layer_bytes = 2 * MiB;
  r.embedding_bytes = 1 * MiB;
  r.head_bytes = 1 * MiB;
  r.kv_bytes_per_token_per_layer = 1024;
  r.scratch_bytes = 1 * MiB;
  r.heads = 4;
  r.kv_heads = 2;
  return r;
}

node_view cpu_node(std::string id, std::uint64_t memory, std::int32_t hosted = 0, std::int32_t same = 0) {
  node_view v;
  v.id = std::move(id);
  v.devices = {{"cpu:0", device_kind::cpu, memory}};
  v.hosted = hosted;
  v.hosted_same = same;
  return v;
}

replica_request request(std::int64_t want = 1024, std::int64_t min = 256) {
  replica_request r;
  r.needs = small_model();
  r.want_kv_tokens = want;
  r.min_kv_tokens = min;
  return r;
}

TEST(assign, a_node_without_the_model_comes_before_a_less_loaded_node_with_it) {
  std::vector<node_view> nodes{cpu_node("a", 64 * MiB, 0, 0), cpu_node("b", 64 * MiB, 2, 0), cpu_node("c", 64 * MiB, 0, 0)};
  nodes[0].hosted = 1, nodes[0].hosted_same = 1;  // a already serves this model
  auto a = assign_replica(nodes, request());
  ASSERT_TRUE(a) << a.error().reason;
  ASSERT_EQ(a->stages.size(), 1u);
  EXPECT_EQ(a->stages[0].node, 2u);  // c: no replica of it and the least loaded
  EXPECT_FALSE(a->across_nodes);
  EXPECT_EQ(a->kv_tokens, 1024);
  ASSERT_EQ(a->stages[0].bytes.size(), 1u);
  EXPECT_EQ(a->stages[0].bytes[0].second, whole_replica_bytes(small_model(), 1024));
}

TEST(assign, the_kv_pool_shrinks_to_what_the_device_leaves_but_not_below_one_sequence) {
  const auto weights = whole_replica_bytes(small_model(), 0);
  std::vector<node_view> nodes{cpu_node("a", weights + 4 * 1024 * 600)};  // 600 tokens of KV
  auto a = assign_replica(nodes, request(1024, 256));
  ASSERT_TRUE(a) << a.error().reason;
  EXPECT_GE(a->kv_tokens, 256);
  EXPECT_LE(a->kv_tokens, 600);
  std::vector<node_view> tiny{cpu_node("a", weights + 4 * 1024 * 100)};  // less than one sequence
  auto refused = assign_replica(tiny, request(1024, 256));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().reason.find("device memory"), std::string::npos) << refused.error().reason;
}

TEST(assign, a_model_no_node_holds_is_split_into_stages_across_nodes) {
  // 12 MiB of weights and scratch: no 9 MiB node holds it, two do as two stages.
  std::vector<node_view> nodes{cpu_node("a", 9 * MiB), cpu_node("b", 9 * MiB)};
  auto a = assign_replica(nodes, request(256, 256));
  ASSERT_TRUE(a) << a.error().reason;
  EXPECT_TRUE(a->across_nodes);
  EXPECT_EQ(a->pipeline_parallel, 2);
  ASSERT_EQ(a->stages.size(), 2u);
  EXPECT_NE(a->stages[0].node, a->stages[1].node);
  for (const auto& s : a->stages) {
    ASSERT_EQ(s.bytes.size(), 1u);
    EXPECT_LE(s.bytes[0].second, 9 * MiB);
  }
}

TEST(assign, nodes_at_their_bound_or_excluded_are_skipped_and_none_left_is_a_refusal) {
  std::vector<node_view> nodes{cpu_node("a", 64 * MiB, 2), cpu_node("b", 64 * MiB)};
  nodes[0].max_replicas = 2;
  nodes[1].excluded = true;
  auto a = assign_replica(nodes, request());
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().reason.find("max-replicas"), std::string::npos) << a.error().reason;
  nodes[1].excluded = false;
  auto b = assign_replica(nodes, request());
  ASSERT_TRUE(b);
  EXPECT_EQ(b->stages[0].node, 1u);
}

TEST(assign, a_node_without_declared_memory_takes_any_replica) {
  node_view v = cpu_node("a", 0);
  v.unbounded = true;
  auto a = assign_replica({v}, request(1 << 20, 256));
  ASSERT_TRUE(a) << a.error().reason;
  EXPECT_EQ(a->kv_tokens, 1 << 20);
}

TEST(assign, an_explicit_split_is_honoured_on_the_nodes_the_order_gives) {
  std::vector<node_view> nodes{cpu_node("a", 64 * MiB, 1, 1), cpu_node("b", 64 * MiB), cpu_node("c", 64 * MiB)};
  auto rq = request();
  rq.pipeline_parallel = 2;
  rq.across_nodes = true;
  auto a = assign_replica(nodes, rq);
  ASSERT_TRUE(a) << a.error().reason;
  ASSERT_EQ(a->stages.size(), 2u);
  EXPECT_EQ(a->stages[0].node, 1u);
  EXPECT_EQ(a->stages[1].node, 2u);
  rq.pipeline_parallel = 4;
  auto too_few = assign_replica(nodes, rq);
  ASSERT_FALSE(too_few);
  EXPECT_NE(too_few.error().reason.find("needs 4 nodes"), std::string::npos) << too_few.error().reason;
}

TEST(assign, a_model_without_known_needs_goes_to_the_first_node_in_order) {
  std::vector<node_view> nodes{cpu_node("a", 1 * MiB, 1, 1), cpu_node("b", 1 * MiB)};
  replica_request rq;
  auto a = assign_replica(nodes, rq);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->stages[0].node, 1u);
}

}  // namespace
}  // namespace troupe::placement

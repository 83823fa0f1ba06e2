#include "placement/planner.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace troupe::placement {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t GiB = 1ull << 30;

// ---- inventories and models -------------------------------------------------------------------------

node gpu_node(std::string id, const std::vector<std::uint64_t>& memories) {
  node n{.id = std::move(id)};
  for (std::size_t i = 0; i < memories.size(); ++i)
    n.devices.push_back({.name = "cuda:" + std::to_string(i), .kind = device_kind::cuda, .memory_bytes = memories[i]});
  return n;
}
node eight_80gib(std::string id) { return gpu_node(std::move(id), std::vector<std::uint64_t>(8, 80 * GiB)); }

// A 2-core CPU box: one CPU device with 24 GiB.
inventory cpu_box() {
  return {.nodes = {{.id = "box", .devices = {{.name = "cpu:0", .kind = device_kind::cpu, .memory_bytes = 24 * GiB}}}}};
}

// Shapes close to real models, with round numbers so the expected plans can be worked out by hand.
// KV per token per layer = 2 (K and V) x kv_heads x head_dim 128 x 2 bytes.
requirements small_1b() {  // 16 x 128 MiB layers (2 GiB) + 256 MiB embedding + 256 MiB head
  return {.layers = 16, .layer_bytes = 128 * MiB, .embedding_bytes = 256 * MiB, .head_bytes = 256 * MiB,
          .kv_bytes_per_token_per_layer = 2048, .scratch_bytes = 512 * MiB, .heads = 32, .kv_heads = 8};
}
requirements llama_8b() {  // 32 x 416 MiB layers (13 GiB) + 1 GiB embedding + 1 GiB head
  return {.layers = 32, .layer_bytes = 416 * MiB, .embedding_bytes = 1 * GiB, .head_bytes = 1 * GiB,
          .kv_bytes_per_token_per_layer = 4096, .scratch_bytes = 2 * GiB, .heads = 32, .kv_heads = 8};
}
requirements llama_70b() {  // 80 x 1728 MiB layers (135 GiB) + 2 GiB embedding + 2 GiB head
  return {.layers = 80, .layer_bytes = 1728 * MiB, .embedding_bytes = 2 * GiB, .head_bytes = 2 * GiB,
          .kv_bytes_per_token_per_layer = 4096, .scratch_bytes = 4 * GiB, .heads = 64, .kv_heads = 8};
}
requirements big_400b() {  // 120 x 6 GiB layers (720 GiB) + 4 GiB embedding + 2 GiB head: more than one 640 GiB node
  return {.layers = 120, .layer_bytes = 6 * GiB, .embedding_bytes = 4 * GiB, .head_bytes = 2 * GiB,
          .kv_bytes_per_token_per_layer = 4096, .scratch_bytes = 4 * GiB, .heads = 128, .kv_heads = 8};
}

// ---- the checker ------------------------------------------------------------------------------------

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

// Checks a plan against the rules, recomputing every byte count from the requirements (not from the
// planner's helpers): each replica covers every layer exactly once in contiguous stages, the embedding
// sits on the first stage and the head on the last, every stage is a tensor-parallel group of one kind
// on one node, no device serves twice, no device holds more than its memory, and each replica's KV
// capacity is at least the policy's minimum and exactly what its tightest device leaves.
void expect_valid(const inventory& inv, const requirements& req, const policy& pol, const plan& p) {
  SCOPED_TRACE(describe(p, inv));
  ASSERT_FALSE(p.replicas.empty());
  if (pol.replicas) {
    EXPECT_EQ(p.replicas.size(), static_cast<std::size_t>(*pol.replicas));
  }
  const std::uint64_t tp = static_cast<std::uint64_t>(p.tensor_parallel);
  ASSERT_GE(p.tensor_parallel, 1);
  if (pol.max_tensor_parallel) {
    EXPECT_LE(p.tensor_parallel, *pol.max_tensor_parallel);
  }
  EXPECT_EQ(req.heads % p.tensor_parallel, 0) << "tensor parallelism must split the heads";
  EXPECT_TRUE(req.kv_heads % p.tensor_parallel == 0 || p.tensor_parallel % req.kv_heads == 0);

  // Expert parallelism: whole experts on the ranks, the fullest holding ceil(experts / tp) of them.
  const std::uint64_t E = static_cast<std::uint64_t>(req.experts), all_experts = E * req.expert_bytes;
  const std::uint64_t per_layer = pol.expert_parallel && E > 0 ? ceil_div(req.layer_bytes - all_experts, tp) + ceil_div(E, tp) * req.expert_bytes
                                                                : ceil_div(req.layer_bytes, tp);
  const std::uint64_t kv_heads_held = ceil_div(static_cast<std::uint64_t>(req.kv_heads), tp);  // replicated below tp
  const std::uint64_t kv_per_layer = ceil_div(req.kv_bytes_per_token_per_layer * kv_heads_held, static_cast<std::uint64_t>(req.kv_heads));

  std::set<std::pair<std::size_t, std::size_t>> used;
  for (std::size_t r = 0; r < p.replicas.size(); ++r) {
    SCOPED_TRACE("replica " + std::to_string(r));
    const replica& rep = p.replicas[r];
    ASSERT_EQ(rep.stages.size(), static_cast<std::size_t>(p.pipeline));
    EXPECT_GE(rep.kv_tokens, pol.min_kv_tokens);
    std::vector<int> covered(static_cast<std::size_t>(req.layers), 0);
    std::int32_t next = 0;
    bool tight = false;  // some device cannot hold one token more
    for (std::size_t s = 0; s < rep.stages.size(); ++s) {
      SCOPED_TRACE("stage " + std::to_string(s));
      const stage& st = rep.stages[s];
      EXPECT_EQ(st.layers.first, next) << "stages are contiguous";
      EXPECT_LT(st.layers.first, st.layers.end) << "a stage holds at least one layer";
      for (std::int32_t l = st.layers.first; l < st.layers.end && l < req.layers; ++l) ++covered[static_cast<std::size_t>(l)];
      next = st.layers.end;

      ASSERT_EQ(st.devices.size(), tp);
      const std::uint64_t layers = static_cast<std::uint64_t>(st.layers.end - st.layers.first);
      const std::uint64_t weights = layers * per_layer + (s == 0 ? ceil_div(req.embedding_bytes, tp) : 0) +
                                    (s + 1 == rep.stages.size() ? ceil_div(req.head_bytes, tp) : 0);
      EXPECT_EQ(st.weight_bytes, weights) << "embedding on the first stage, head on the last, layers split over the ranks";
      EXPECT_EQ(st.kv_bytes_per_token, layers * kv_per_layer);
      for (const device_ref& d : st.devices) {
        ASSERT_LT(d.node, inv.nodes.size());
        ASSERT_LT(d.device, inv.nodes[d.node].devices.size());
        EXPECT_EQ(link_between(st.devices.front(), d), link_kind::same_node) << "a tensor-parallel group stays on one node";
        EXPECT_EQ(at(inv, d).kind, p.kind) << "one kind of device per replica";
        EXPECT_TRUE(used.insert({d.node, d.device}).second) << at(inv, d).name << " serves twice";
        const std::uint64_t memory = at(inv, d).memory_bytes;
        const std::uint64_t kv = static_cast<std::uint64_t>(rep.kv_tokens) * layers * kv_per_layer;
        EXPECT_LE(req.scratch_bytes + weights + kv, memory) << at(inv, d).name << " is over-full";
        if (req.scratch_bytes + weights + kv + layers * kv_per_layer > memory) tight = true;
      }
    }
    EXPECT_EQ(next, req.layers) << "the last stage ends at the last layer";
    for (std::size_t l = 0; l < covered.size(); ++l) EXPECT_EQ(covered[l], 1) << "layer " << l;
    EXPECT_TRUE(tight) << "kv_tokens " << rep.kv_tokens << " leaves room for another token on every device";
  }
}

plan expect_plan(const inventory& inv, const requirements& req, const policy& pol) {
  auto p = make_plan(inv, req, pol);
  if (!p) {
    ADD_FAILURE() << p.error().message();
    return {};
  }
  expect_valid(inv, req, pol, *p);
  return *p;
}

std::vector<device_ref> on_node(std::size_t node, std::vector<std::size_t> devices) {
  std::vector<device_ref> out;
  for (std::size_t d : devices) out.push_back({.node = node, .device = d});
  return out;
}

// ---- plans ------------------------------------------------------------------------------------------

TEST(placement_plan, cpu_box_holds_a_small_model_on_its_one_device_under_every_goal) {
  const inventory inv = cpu_box();
  for (objective goal : {objective::latency, objective::capacity, objective::throughput}) {
    SCOPED_TRACE(std::string(name(goal)));
    const plan p = expect_plan(inv, small_1b(), {.goal = goal});
    EXPECT_EQ(p.kind, device_kind::cpu);
    EXPECT_EQ(p.tensor_parallel, 1);
    EXPECT_EQ(p.pipeline, 1);
    ASSERT_EQ(p.replicas.size(), 1u);
    const stage& st = p.replicas[0].stages[0];
    EXPECT_EQ(st.devices, on_node(0, {0}));
    EXPECT_EQ(st.layers, (layer_range{0, 16}));
    EXPECT_EQ(st.weight_bytes, 2560 * MiB);   // 16 x 128 MiB + 256 MiB embedding + 256 MiB head
    EXPECT_EQ(st.kv_bytes_per_token, 32768u);  // 16 layers x 2048 bytes
    // 24 GiB - 512 MiB scratch - 2560 MiB weights = 21504 MiB, / 32768 bytes = 21504 x 32 tokens
    EXPECT_EQ(p.replicas[0].kv_tokens, 688128);
  }
}

TEST(placement_plan, latency_splits_a_70b_model_over_all_eight_gpus_of_a_node) {
  const inventory inv{.nodes = {eight_80gib("dgx")}};
  const plan p = expect_plan(inv, llama_70b(), {.goal = objective::latency});
  EXPECT_EQ(p.kind, device_kind::cuda);
  EXPECT_EQ(p.tensor_parallel, 8);
  EXPECT_EQ(p.pipeline, 1);
  ASSERT_EQ(p.replicas.size(), 1u);
  const stage& st = p.replicas[0].stages[0];
  EXPECT_EQ(st.devices, on_node(0, {0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(st.layers, (layer_range{0, 80}));
  EXPECT_EQ(st.weight_bytes, 17792 * MiB);   // 80 x 216 MiB + 256 MiB + 256 MiB
  EXPECT_EQ(st.kv_bytes_per_token, 40960u);  // 80 layers x 4096 / 8 (one KV head per rank)
  // 80 GiB - 4 GiB - 17792 MiB = 60032 MiB = 62948114432 bytes, / 40960 = 1536819.2
  EXPECT_EQ(p.replicas[0].kv_tokens, 1536819);
}

TEST(placement_plan, latency_with_a_tensor_parallel_cap_fills_the_node_with_replicas) {
  const inventory inv{.nodes = {eight_80gib("dgx")}};
  const plan p = expect_plan(inv, llama_70b(), {.goal = objective::latency, .max_tensor_parallel = 4});
  EXPECT_EQ(p.tensor_parallel, 4);
  EXPECT_EQ(p.pipeline, 1);
  ASSERT_EQ(p.replicas.size(), 2u);
  EXPECT_EQ(p.replicas[0].stages[0].devices, on_node(0, {0, 1, 2, 3}));
  EXPECT_EQ(p.replicas[1].stages[0].devices, on_node(0, {4, 5, 6, 7}));
  // 80 x 432 MiB + 512 MiB + 512 MiB = 35584 MiB; 80 GiB - 4 GiB - 35584 MiB = 42240 MiB;
  // per token 80 x 4096 x 2/8 = 81920 bytes; 42240 MiB / 81920 = 540672
  for (const replica& r : p.replicas) EXPECT_EQ(r.kv_tokens, 540672);
}

TEST(placement_plan, latency_with_a_replica_count_takes_the_widest_groups_that_give_it) {
  const inventory inv{.nodes = {eight_80gib("dgx")}};
  const plan p = expect_plan(inv, llama_8b(), {.goal = objective::latency, .replicas = 2});
  EXPECT_EQ(p.tensor_parallel, 4);
  EXPECT_EQ(p.pipeline, 1);
  ASSERT_EQ(p.replicas.size(), 2u);
  EXPECT_EQ(p.replicas[0].stages[0].devices, on_node(0, {0, 1, 2, 3}));
  EXPECT_EQ(p.replicas[1].stages[0].devices, on_node(0, {4, 5, 6, 7}));
}

TEST(placement_plan, throughput_gives_each_gpu_its_own_8b_replica) {
  const inventory inv{.nodes = {eight_80gib("dgx")}};
  const plan p = expect_plan(inv, llama_8b(), {.goal = objective::throughput});
  EXPECT_EQ(p.tensor_parallel, 1);
  EXPECT_EQ(p.pipeline, 1);
  ASSERT_EQ(p.replicas.size(), 8u);
  for (std::size_t r = 0; r < 8; ++r) {
    EXPECT_EQ(p.replicas[r].stages[0].devices, on_node(0, {r}));
    EXPECT_EQ(p.replicas[r].stages[0].weight_bytes, 15360 * MiB);  // 13 GiB + 1 GiB + 1 GiB
    // 80 GiB - 2 GiB - 15 GiB = 63 GiB = 64512 MiB, / (32 x 4096 = 131072) = 64512 x 8
    EXPECT_EQ(p.replicas[r].kv_tokens, 516096);
  }
}

TEST(placement_plan, throughput_packs_a_70b_model_as_four_tensor_parallel_pairs) {
  const inventory inv{.nodes = {eight_80gib("dgx")}};
  const plan p = expect_plan(inv, llama_70b(), {.goal = objective::throughput});
  EXPECT_EQ(p.tensor_parallel, 2);  // one GPU cannot hold 139 GiB; pairs beat pipelines of two (fewer stages)
  EXPECT_EQ(p.pipeline, 1);
  ASSERT_EQ(p.replicas.size(), 4u);
  for (std::size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(p.replicas[r].stages[0].devices, on_node(0, {2 * r, 2 * r + 1}));
    // 80 x 864 MiB + 1024 MiB + 1024 MiB = 71168 MiB; 81920 - 4096 - 71168 = 6656 MiB;
    // per token 80 x 4096 x 4/8 = 163840 bytes; 6656 MiB / 163840 = 42598.4
    EXPECT_EQ(p.replicas[r].kv_tokens, 42598);
  }
}

TEST(placement_plan, a_kv_minimum_moves_throughput_to_wider_replicas) {
  const inventory inv{.nodes = {eight_80gib("dgx")}};
  // One GPU per replica gives 516096 tokens (above); asking for 600000 needs pairs.
  const plan p = expect_plan(inv, llama_8b(), {.goal = objective::throughput, .min_kv_tokens = 600000});
  EXPECT_EQ(p.tensor_parallel, 2);
  EXPECT_EQ(p.pipeline, 1);
  ASSERT_EQ(p.replicas.size(), 4u);
  // 32 x 208 MiB + 512 MiB + 512 MiB = 7680 MiB; 81920 - 2048 - 7680 = 72192 MiB; / (32 x 2048) = 72192 x 16
  for (const replica& r : p.replicas) EXPECT_EQ(r.kv_tokens, 1155072);
}

TEST(placement_plan, kv_heads_fewer_than_the_ranks_are_replicated) {
  const inventory inv{.nodes = {eight_80gib("dgx")}};
  requirements req = llama_8b();
  req.kv_heads = 2;
  req.kv_bytes_per_token_per_layer = 1024;  // 2 x 2 heads x 128 x 2 bytes
  EXPECT_EQ(kv_heads_per_rank(req, 8), 1);
  const plan p = expect_plan(inv, req, {.goal = objective::latency});
  EXPECT_EQ(p.tensor_parallel, 8);
  ASSERT_EQ(p.replicas.size(), 1u);
  // Each rank holds one of the two KV heads: 512 bytes per layer, not 1024 / 8.
  EXPECT_EQ(p.replicas[0].stages[0].kv_bytes_per_token, 32u * 512u);
}

TEST(placement_plan, capacity_pipelines_a_model_too_big_for_one_node_across_two) {
  const inventory inv{.nodes = {eight_80gib("node-a"), eight_80gib("node-b")}};
  const requirements req = big_400b();
  const plan p = expect_plan(inv, req, {.goal = objective::capacity});
  EXPECT_EQ(p.kind, device_kind::cuda);
  EXPECT_EQ(p.tensor_parallel, 8);
  EXPECT_EQ(p.pipeline, 2);
  ASSERT_EQ(p.replicas.size(), 1u);
  const replica& r = p.replicas[0];
  EXPECT_EQ(r.stages[0].devices, on_node(0, {0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r.stages[1].devices, on_node(1, {0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(link_between(r.stages[0].devices[0], r.stages[1].devices[0]), link_kind::network);
  EXPECT_EQ(r.stages[0].layers, (layer_range{0, 60}));
  EXPECT_EQ(r.stages[1].layers, (layer_range{60, 120}));
  // Per GPU: 60 x 768 MiB = 45 GiB of layers, plus 512 MiB of embedding on the first stage and 256 MiB
  // of head on the last.
  EXPECT_EQ(r.stages[0].weight_bytes, 45 * GiB + 512 * MiB);
  EXPECT_EQ(r.stages[1].weight_bytes, 45 * GiB + 256 * MiB);
  // The first stage is tighter: 80 - 4 - 45.5 = 30.5 GiB, / (60 x 512 bytes) = 1066052.3
  EXPECT_EQ(r.kv_tokens, 1066052);
  EXPECT_EQ(describe(p, inv),
            "cuda, pipeline 2 x tensor parallel 8, 1 replica\n"
            "replica 0 (kv 1066052 tokens): "
            "node-a[cuda:0 cuda:1 cuda:2 cuda:3 cuda:4 cuda:5 cuda:6 cuda:7] layers [0, 60) | "
            "node-b[cuda:0 cuda:1 cuda:2 cuda:3 cuda:4 cuda:5 cuda:6 cuda:7] layers [60, 120)");

  // Latency and throughput land on the same shape: one node cannot hold it, and two replicas never fit.
  for (objective goal : {objective::latency, objective::throughput}) {
    SCOPED_TRACE(std::string(name(goal)));
    const plan q = expect_plan(inv, req, {.goal = goal});
    EXPECT_EQ(q.tensor_parallel, 8);
    EXPECT_EQ(q.pipeline, 2);
    EXPECT_EQ(q.replicas.size(), 1u);
  }
}

TEST(placement_plan, capacity_spans_both_nodes_even_when_one_would_do) {
  const inventory inv{.nodes = {eight_80gib("node-a"), eight_80gib("node-b")}};
  const plan p = expect_plan(inv, llama_70b(), {.goal = objective::capacity});
  EXPECT_EQ(p.tensor_parallel, 8);
  EXPECT_EQ(p.pipeline, 2);
  ASSERT_EQ(p.replicas.size(), 1u);
  // Latency keeps it on one node, one replica per node.
  const plan q = expect_plan(inv, llama_70b(), {.goal = objective::latency});
  EXPECT_EQ(q.tensor_parallel, 8);
  EXPECT_EQ(q.pipeline, 1);
  EXPECT_EQ(q.replicas.size(), 2u);
  EXPECT_GT(p.replicas[0].kv_tokens, 2 * q.replicas[0].kv_tokens);
}

// Four 24 GiB GPUs listed before four 80 GiB ones; the model (32 x 8 GiB layers) cannot go eight-wide:
// 32 GiB per GPU does not fit a 24 GiB one.
inventory mixed_node() { return {.nodes = {gpu_node("mixed", {24 * GiB, 24 * GiB, 24 * GiB, 24 * GiB, 80 * GiB, 80 * GiB, 80 * GiB, 80 * GiB})}}; }
requirements mixed_model() {
  return {.layers = 32, .layer_bytes = 8 * GiB, .embedding_bytes = 2 * GiB, .head_bytes = 2 * GiB,
          .kv_bytes_per_token_per_layer = 4096, .scratch_bytes = 1 * GiB, .heads = 32, .kv_heads = 8};
}

TEST(placement_plan, mixed_memory_latency_keeps_the_shards_on_the_large_gpus) {
  const plan p = expect_plan(mixed_node(), mixed_model(), {.goal = objective::latency});
  EXPECT_EQ(p.tensor_parallel, 4);
  EXPECT_EQ(p.pipeline, 1);
  ASSERT_EQ(p.replicas.size(), 1u);  // the four 24 GiB GPUs cannot hold a second one
  EXPECT_EQ(p.replicas[0].stages[0].devices, on_node(0, {4, 5, 6, 7}));
  EXPECT_EQ(p.replicas[0].stages[0].weight_bytes, 65 * GiB);  // 32 x 2 GiB + 0.5 + 0.5
  // 80 - 1 - 65 = 14 GiB, / (32 x 1024 bytes) = 14 x 32768
  EXPECT_EQ(p.replicas[0].kv_tokens, 458752);
}

TEST(placement_plan, mixed_memory_capacity_gives_the_small_gpus_fewer_layers) {
  const plan p = expect_plan(mixed_node(), mixed_model(), {.goal = objective::capacity});
  EXPECT_EQ(p.tensor_parallel, 4);
  EXPECT_EQ(p.pipeline, 2);
  ASSERT_EQ(p.replicas.size(), 1u);
  const replica& r = p.replicas[0];
  EXPECT_EQ(r.stages[0].devices, on_node(0, {4, 5, 6, 7}));
  EXPECT_EQ(r.stages[1].devices, on_node(0, {0, 1, 2, 3}));
  // Room per rank after scratch and embedding / head: 78.5 and 22.5 GiB, 2 GiB per layer. 25/7 balances
  // the tokens best: (78.5 - 50) / 25 = 1.14 and (22.5 - 14) / 7 = 1.21 GiB per layer (24/8 gives 0.81).
  EXPECT_EQ(r.stages[0].layers, (layer_range{0, 25}));
  EXPECT_EQ(r.stages[1].layers, (layer_range{25, 32}));
  // 28.5 GiB / (25 x 1024 bytes) = 1195376.6
  EXPECT_EQ(r.kv_tokens, 1195376);
}

TEST(placement_plan, a_plan_uses_the_fastest_kind_the_model_fits) {
  inventory inv{.nodes = {{.id = "ws",
                           .devices = {{.name = "cpu:0", .kind = device_kind::cpu, .memory_bytes = 64 * GiB},
                                       {.name = "cuda:0", .kind = device_kind::cuda, .memory_bytes = 8 * GiB}}}}};
  const plan small = expect_plan(inv, small_1b(), {.goal = objective::throughput});
  EXPECT_EQ(small.kind, device_kind::cuda);
  ASSERT_EQ(small.replicas.size(), 1u);
  EXPECT_EQ(small.replicas[0].stages[0].devices, on_node(0, {1}));
  const plan big = expect_plan(inv, llama_8b(), {.goal = objective::throughput});  // 15 GiB: only the CPU holds it
  EXPECT_EQ(big.kind, device_kind::cpu);
  ASSERT_EQ(big.replicas.size(), 1u);
  EXPECT_EQ(big.replicas[0].stages[0].devices, on_node(0, {0}));
}

TEST(placement_plan, admissible_tensor_parallel_degrees) {
  const requirements gqa = llama_70b();  // 64 heads, 8 KV heads
  for (std::int32_t tp : {1, 2, 4, 8, 16, 32, 64}) EXPECT_TRUE(admissible_tensor_parallel(gqa, tp)) << tp;
  for (std::int32_t tp : {0, 3, 5, 6, 7, 12, 128}) EXPECT_FALSE(admissible_tensor_parallel(gqa, tp)) << tp;
  EXPECT_EQ(kv_heads_per_rank(gqa, 2), 4);
  EXPECT_EQ(kv_heads_per_rank(gqa, 16), 1);  // replicated: two ranks per KV head
  requirements odd = gqa;
  odd.heads = 10;
  odd.kv_heads = 5;
  EXPECT_FALSE(admissible_tensor_parallel(odd, 2));  // splits the heads but not the 5 KV heads
  EXPECT_TRUE(admissible_tensor_parallel(odd, 5));
  EXPECT_TRUE(admissible_tensor_parallel(odd, 10));
}

// ---- refusals ---------------------------------------------------------------------------------------

TEST(placement_refusals, a_model_bigger_than_the_whole_inventory_says_by_how_much) {
  const inventory inv{.nodes = {eight_80gib("node-a"), eight_80gib("node-b")}};
  requirements req = big_400b();
  req.layers = 80;
  req.layer_bytes = 24 * GiB;  // 1920 GiB of layers
  req.embedding_bytes = 4 * GiB;
  req.head_bytes = 4 * GiB;
  req.heads = 64;
  auto p = make_plan(inv, req, {.goal = objective::capacity});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, placement_error_code::does_not_fit);
  // All 16 GPUs, every one over-full: 1928 GiB of weights + 16 x 4 GiB scratch + one token of KV
  // (80 x 4096 bytes) - 16 x 80 GiB = 712 GiB + 327680 bytes.
  EXPECT_EQ(p.error().shortfall_bytes, 712 * GiB + 327680);
  const std::string m = p.error().message();
  EXPECT_NE(m.find("764504506368 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("pipeline 2 x tensor parallel 8 on cuda"), std::string::npos) << m;
}

TEST(placement_refusals, a_kv_minimum_no_device_can_hold_is_a_shortfall) {
  auto p = make_plan(cpu_box(), small_1b(), {.goal = objective::latency, .min_kv_tokens = 1000000});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, placement_error_code::does_not_fit);
  // 3072 MiB + 1000000 x 32768 bytes - 24 GiB
  EXPECT_EQ(p.error().shortfall_bytes, 3072 * MiB + 32768000000ull - 24 * GiB);
}

TEST(placement_refusals, heads_that_no_fitting_degree_can_split) {
  // One 20 GiB layer does not fit a 16 GiB GPU; two ranks would (10 GiB each, pipelined), but 2 does not
  // split 5 KV heads, and 5 or 10 ranks are more than the node has.
  const inventory inv{.nodes = {gpu_node("small", {16 * GiB, 16 * GiB, 16 * GiB, 16 * GiB})}};
  const requirements req{.layers = 2, .layer_bytes = 20 * GiB, .kv_bytes_per_token_per_layer = 1280, .scratch_bytes = 1 * GiB,
                         .heads = 10, .kv_heads = 5};
  auto p = make_plan(inv, req, {.goal = objective::latency});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, placement_error_code::heads_not_divisible) << p.error().message();
  EXPECT_EQ(p.error().tensor_parallel, 2);
}

TEST(placement_refusals, no_devices) {
  for (const inventory& inv : {inventory{}, inventory{.nodes = {{.id = "empty"}}}}) {
    auto p = make_plan(inv, small_1b(), {});
    ASSERT_FALSE(p);
    EXPECT_EQ(p.error().code, placement_error_code::no_devices);
  }
}

TEST(placement_refusals, bad_requirements_policy_and_inventory) {
  const inventory inv = cpu_box();
  auto code_of = [&](const inventory& i, const requirements& req, const policy& pol) {
    auto p = make_plan(i, req, pol);
    return p ? std::string("a plan") : std::string(name(p.error().code));
  };
  requirements zero_layers = small_1b();
  zero_layers.layers = 0;
  EXPECT_EQ(code_of(inv, zero_layers, {}), "bad_requirements");
  requirements no_heads = small_1b();
  no_heads.heads = 0;
  EXPECT_EQ(code_of(inv, no_heads, {}), "bad_requirements");
  requirements ragged = small_1b();
  ragged.kv_heads = 5;  // 32 heads are not a multiple of 5
  EXPECT_EQ(code_of(inv, ragged, {}), "bad_requirements");
  requirements no_kv = small_1b();
  no_kv.kv_bytes_per_token_per_layer = 0;
  EXPECT_EQ(code_of(inv, no_kv, {}), "bad_requirements");

  EXPECT_EQ(code_of(inv, small_1b(), {.replicas = 0}), "bad_policy");
  EXPECT_EQ(code_of(inv, small_1b(), {.max_tensor_parallel = 0}), "bad_policy");
  EXPECT_EQ(code_of(inv, small_1b(), {.min_kv_tokens = -1}), "bad_policy");
  EXPECT_EQ(code_of(inv, small_1b(), {.min_kv_tokens = max_kv_tokens + 1}), "bad_policy");

  const inventory twice{.nodes = {eight_80gib("a"), eight_80gib("a")}};
  EXPECT_EQ(code_of(twice, small_1b(), {}), "bad_inventory");
}

TEST(placement_refusals, absurd_sizes_are_refused_without_overflow) {
  // Every byte count at its maximum, the most layers and KV tokens: the arithmetic must neither wrap
  // (which could turn a refusal into a plan) nor trap; the shortfall saturates.
  const inventory inv{.nodes = {eight_80gib("node-a"), eight_80gib("node-b")}};
  constexpr std::uint64_t huge = ~std::uint64_t{0};
  const requirements req{.layers = max_layers, .layer_bytes = huge, .embedding_bytes = huge, .head_bytes = huge,
                         .kv_bytes_per_token_per_layer = huge, .scratch_bytes = huge, .heads = 64, .kv_heads = 8};
  auto p = make_plan(inv, req, {.goal = objective::capacity, .min_kv_tokens = max_kv_tokens});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, placement_error_code::does_not_fit);
  EXPECT_EQ(p.error().shortfall_bytes, huge);
}

TEST(placement_refusals, more_replicas_than_fit) {
  const inventory inv{.nodes = {eight_80gib("dgx")}};
  auto p = make_plan(inv, llama_70b(), {.goal = objective::throughput, .replicas = 5});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, placement_error_code::replicas_do_not_fit) << p.error().message();
  EXPECT_EQ(p.error().replicas_fit, 4);
}

// A routed model: 6 experts of 100 MiB and 40 MiB of attention per layer. Split by width (tensor
// parallel) 4 ranks hold 160 MiB of each layer; split by whole experts 4 ranks hold 10 MiB of
// attention and 2 experts (210 MiB), so four 2 GiB devices take the model one way and not the other.
requirements routed_6x100() {
  return {.layers = 10, .layer_bytes = 640 * MiB, .embedding_bytes = 16 * MiB, .head_bytes = 16 * MiB,
          .kv_bytes_per_token_per_layer = 1024, .scratch_bytes = 64 * MiB, .heads = 8, .kv_heads = 4, .experts = 6, .expert_bytes = 100 * MiB};
}

TEST(planner, expert_parallelism_counts_whole_experts_per_rank) {
  const auto req = routed_6x100();
  EXPECT_EQ(layer_bytes_per_rank(req, 4, false), 160 * MiB);
  EXPECT_EQ(layer_bytes_per_rank(req, 4, true), 10 * MiB + 2 * 100 * MiB);
  EXPECT_EQ(layer_bytes_per_rank(req, 2, true), 20 * MiB + 3 * 100 * MiB);
  EXPECT_EQ(layer_bytes_per_rank(req, 1, true), 640 * MiB);
  EXPECT_EQ(layer_bytes_per_rank(req, 8, true), 5 * MiB + 100 * MiB);  // more ranks than experts: one each at most

  const inventory inv{.nodes = {gpu_node("a", std::vector<std::uint64_t>(4, 2 * GiB))}};
  policy tp;
  tp.min_kv_tokens = 1024;
  auto by_width = make_plan(inv, req, tp);
  ASSERT_TRUE(by_width) << by_width.error().message();
  expect_valid(inv, req, tp, *by_width);
  EXPECT_EQ(by_width->tensor_parallel, 4);
  EXPECT_EQ(by_width->pipeline, 1);
  // Whole experts: 6 do not split 4 ways (and 10 x 210 MiB would not fit a 2 GiB device if they did),
  // so two stages of two ranks, 3 experts each (5 x 320 MiB a device).
  policy ep = tp;
  ep.expert_parallel = true;
  auto by_expert = make_plan(inv, req, ep);
  ASSERT_TRUE(by_expert) << by_expert.error().message();
  expect_valid(inv, req, ep, *by_expert);
  EXPECT_EQ(by_expert->tensor_parallel, 2);
  EXPECT_EQ(by_expert->pipeline, 2);
  for (const auto& st : by_expert->replicas[0].stages)
    EXPECT_EQ(st.weight_bytes % MiB, 0u) << "whole experts and whole MiB of attention";
}

TEST(planner, expert_parallelism_of_a_dense_model_or_oversized_experts_is_refused) {
  auto dense = small_1b();
  policy ep;
  ep.expert_parallel = true;
  auto r = make_plan(cpu_box(), dense, ep);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, placement_error_code::bad_policy);
  auto bad = routed_6x100();
  bad.expert_bytes = 200 * MiB;  // 6 x 200 MiB in a 640 MiB layer
  auto r2 = make_plan(cpu_box(), bad, policy{});
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error().code, placement_error_code::bad_requirements);
}

}  // namespace
}  // namespace troupe::placement

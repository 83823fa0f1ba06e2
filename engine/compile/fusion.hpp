#pragma once
// Fusion analyses shared by the targets: which equations a target may run as one kernel. Each returns,
// per equation, the equation fused into it (or -1); the target decides after buffer planning whether
// the bytes allow it (engine/exec/cpu/cpu_executor.cpp, engine/exec/cuda/cuda_executor.cpp).
#include <cstdint>
#include <vector>

#include "engine/compile/passes.hpp"

namespace troupe::compile {

// How many readers each value has among the equations that run, the outputs and the state outputs.
std::vector<int> reader_counts(const graph::graph& g, const pruned_graph& p);

// The residual epilogue: add(linear(x, W), r) (either operand order, f32, one shape), where the linear
// runs just before the add and its result has no other reader, becomes one matmul that stores
// x W^T + r straight into the add's buffer. Per equation: the fused add's linear, else -1.
std::vector<std::int64_t> residual_fusions(const graph::graph& g, const pruned_graph& p, const std::vector<int>& uses);

// The gated feed-forward middle: mul(act(g), u) (either operand order, act = silu or gelu_tanh, f32,
// one shape), where act(g) has no other reader, becomes one pass act(g) * u; the activation never runs
// on its own. Per equation: the fused mul's activation, else -1.
std::vector<std::int64_t> gated_fusions(const graph::graph& g, const pruned_graph& p, const std::vector<int>& uses);

// Ops that read stored weights or talk to other ranks: a target's own kernels run them, so folding
// leaves them alone.
bool stays_unfolded(const graph::equation& e);

// Everything a target does between a traced graph and its lowering: fold and prune (keeping
// `stays_unfolded` ops), find the fusion candidates (their skipped producers' first inputs live until
// the fused step), and plan the buffers (a reshape shares its input's bytes, a scatter into a state
// updates the state in place).
struct target_plan {
  pruned_graph pruned;
  buffer_plan plan;
  std::vector<std::int64_t> residual_linear;  // residual_fusions
  std::vector<std::int64_t> gated_act;        // gated_fusions
};
result<target_plan, compile_error> plan_for_target(const graph::graph& g, const weight_lookup& weights);

// Which candidates fuse once every value has its address (`ptr`, per value; null: none yet): a
// residual epilogue unless the add's bytes overlap x or partly overlap r, a gated middle unless the
// mul's bytes partly overlap g or u (elementwise, so the very same bytes are fine).
struct fusion_choice {
  std::vector<std::int64_t> residual_side;  // per add: the operand that is the linear (0 or 1), else -1
  std::vector<std::int64_t> gated_of;       // per mul: its activation equation, else -1
  std::vector<bool> fused;                  // per equation: runs inside another
};
fusion_choice choose_fusions(const graph::graph& g, const target_plan& p, const std::vector<std::byte*>& ptr);

}  // namespace troupe::compile

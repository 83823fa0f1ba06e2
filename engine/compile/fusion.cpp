#include "engine/compile/fusion.hpp"

#include <algorithm>

namespace troupe::compile {

using graph::op;

std::vector<int> reader_counts(const graph::graph& g, const pruned_graph& p) {
  std::vector<int> uses(g.values().size(), 0);
  for (std::size_t i = 0; i < g.equations().size(); ++i)
    if (p.runs[i])
      for (auto v : g.equations()[i].inputs) ++uses[v.index];
  for (const auto& o : g.outputs()) ++uses[o.value.index];
  for (const auto& s : g.states()) ++uses[s.out.index];
  return uses;
}

std::vector<std::int64_t> residual_fusions(const graph::graph& g, const pruned_graph& p, const std::vector<int>& uses) {
  std::vector<std::int64_t> linear_of(g.equations().size(), -1);
  std::vector<std::int64_t> producer(g.values().size(), -1);
  std::int64_t prev = -1;
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    if (!p.runs[i]) continue;
    const auto& e = g.equations()[i];
    const auto& ot = g.info(e.out).type;
    if (e.code == op::add && ot.type == dtype::f32 && e.inputs[0] != e.inputs[1]) {
      for (int side = 0; side < 2; ++side) {
        const auto lv = e.inputs[static_cast<std::size_t>(side)], rv = e.inputs[static_cast<std::size_t>(1 - side)];
        const std::int64_t j = producer[lv.index];
        if (j < 0 || j != prev || uses[lv.index] != 1) continue;
        const auto& le = g.equations()[static_cast<std::size_t>(j)];
        const auto& lt = g.info(lv).type;
        const auto& rt = g.info(rv).type;
        if (le.code != op::linear || g.info(le.inputs[0]).type.type != dtype::f32 || lt.type != dtype::f32 ||
            rt.type != dtype::f32 || lt.dims != ot.dims || rt.dims != ot.dims)
          continue;
        linear_of[i] = j;
        break;
      }
    }
    producer[e.out.index] = static_cast<std::int64_t>(i);
    prev = static_cast<std::int64_t>(i);
  }
  return linear_of;
}

std::vector<std::int64_t> gated_fusions(const graph::graph& g, const pruned_graph& p, const std::vector<int>& uses) {
  std::vector<std::int64_t> act_of(g.equations().size(), -1);
  std::vector<std::int64_t> producer(g.values().size(), -1);
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    if (!p.runs[i]) continue;
    const auto& e = g.equations()[i];
    const auto& ot = g.info(e.out).type;
    if (e.code == op::mul && ot.type == dtype::f32) {
      for (int side = 0; side < 2; ++side) {
        const auto av = e.inputs[static_cast<std::size_t>(side)], uv = e.inputs[static_cast<std::size_t>(1 - side)];
        const std::int64_t j = producer[av.index];
        if (j < 0 || uses[av.index] != 1 || av == uv) continue;
        const auto& ae = g.equations()[static_cast<std::size_t>(j)];
        if (ae.code != op::silu && ae.code != op::gelu_tanh) continue;
        const auto& at = g.info(av).type;
        const auto& gt = g.info(ae.inputs[0]).type;
        const auto& ut = g.info(uv).type;
        if (at.type != dtype::f32 || gt.type != dtype::f32 || ut.type != dtype::f32 || at.dims != ot.dims ||
            gt.dims != ot.dims || ut.dims != ot.dims)
          continue;
        act_of[i] = j;
        break;
      }
    }
    producer[e.out.index] = static_cast<std::int64_t>(i);
  }
  return act_of;
}

bool stays_unfolded(const graph::equation& e) {
  switch (e.code) {
    case op::linear: case op::linear_id: case op::gather_rows: case op::scatter_rows: case op::attention:
    case op::all_reduce: case op::all_gather: case op::pipe_send: case op::pipe_recv:
      return true;
    default:
      return false;
  }
}

result<target_plan, compile_error> plan_for_target(const graph::graph& g, const weight_lookup& weights) {
  auto pruned = fold_and_prune(g, weights, [](const graph::equation& e) { return !stays_unfolded(e); });
  if (!pruned) return unexpected(pruned.error());
  target_plan t;
  t.pruned = std::move(*pruned);
  t.pruned.source = &g;
  const auto readers = reader_counts(g, t.pruned);
  t.residual_linear = residual_fusions(g, t.pruned, readers);
  t.gated_act = gated_fusions(g, t.pruned, readers);
  // A fused step reads its skipped producer's first input itself (a fused linear's x at its add, a
  // fused gated mul's g), so that input (and what it aliases) lives until the fused step.
  for (const auto* fused_of : {&t.residual_linear, &t.gated_act})
    for (std::size_t i = 0; i < g.equations().size(); ++i) {
      const std::int64_t j = (*fused_of)[i];
      if (j < 0) continue;
      auto& lu = t.pruned.last_use[g.equations()[static_cast<std::size_t>(j)].inputs[0].index];
      lu = std::max(lu, static_cast<std::int64_t>(i));
    }
  std::vector<bool> is_state_in(g.values().size(), false);
  for (const auto& s : g.states()) is_state_in[s.in.index] = true;
  t.plan = plan_buffers(t.pruned, [&](const graph::equation& e) {
    if (e.code == op::reshape) return 0;
    if (e.code == op::scatter_rows && is_state_in[e.inputs[0].index] &&
        t.pruned.last_use[e.inputs[0].index] <= static_cast<std::int64_t>(&e - g.equations().data()))
      return 0;
    return -1;
  });
  return t;
}

fusion_choice choose_fusions(const graph::graph& g, const target_plan& p, const std::vector<std::byte*>& ptr) {
  fusion_choice c;
  c.residual_side.assign(g.equations().size(), -1);
  c.gated_of.assign(g.equations().size(), -1);
  c.fused.assign(g.equations().size(), false);
  auto bytes_of = [&](graph::value_id v) { return g.info(v).type.dims.numel() * static_cast<std::int64_t>(sizeof(float)); };
  auto overlap = [&](graph::value_id a, graph::value_id b) {
    const std::byte *pa = ptr[a.index], *pb = ptr[b.index];
    return pa && pb && pa < pb + bytes_of(b) && pb < pa + bytes_of(a);
  };
  auto partly = [&](graph::value_id a, graph::value_id b) { return overlap(a, b) && ptr[a.index] != ptr[b.index]; };
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    const std::int64_t j = p.residual_linear[i];
    if (j < 0) continue;
    const auto& e = g.equations()[i];
    const auto& le = g.equations()[static_cast<std::size_t>(j)];
    const int side = e.inputs[0] == le.out ? 0 : 1;
    const auto rv = e.inputs[static_cast<std::size_t>(1 - side)];
    if (!ptr[e.out.index] || overlap(e.out, le.inputs[0]) || partly(e.out, rv)) continue;
    c.residual_side[i] = side;
    c.fused[static_cast<std::size_t>(j)] = true;
  }
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    const std::int64_t j = p.gated_act[i];
    if (j < 0) continue;
    const auto& e = g.equations()[i];
    const auto& ae = g.equations()[static_cast<std::size_t>(j)];
    const auto uv = e.inputs[0] == ae.out ? e.inputs[1] : e.inputs[0];
    if (!ptr[e.out.index] || partly(e.out, ae.inputs[0]) || partly(e.out, uv)) continue;
    c.gated_of[i] = j;
    c.fused[static_cast<std::size_t>(j)] = true;
  }
  return c;
}

}  // namespace troupe::compile

#include "engine/compile/passes.hpp"

#include <algorithm>

#include "engine/eval/oracle.hpp"
#include "engine/graph/builder.hpp"

namespace troupe::compile {

namespace {

// Evaluates one equation over constant inputs with the oracle.
result<tensor, compile_error> evaluate_one(const graph::graph& g, const graph::equation& e, const std::vector<tensor_view>& inputs,
                                           const std::string& where) {
  graph::builder b;
  std::vector<graph::value_id> ins;
  for (const auto& v : inputs) ins.push_back(b.literal(tensor::copy_of(v)));
  b.output("out", b.apply(e.code, ins, e.attrs));
  auto mini = std::move(b).finish();
  if (!mini) return unexpected(compile_error{where, "cannot fold: " + mini.error().message()});
  auto ev = eval::evaluate(*mini, {});
  if (!ev) return unexpected(compile_error{where, "cannot fold: " + ev.error().message()});
  (void)g;
  return std::move(ev->outputs.at("out"));
}

}  // namespace

result<pruned_graph, compile_error> fold_and_prune(const graph::graph& g, const weight_lookup& weights,
                                                   const std::function<bool(const graph::equation&)>& foldable,
                                                   const fold_options& opt) {
  pruned_graph p;
  p.source = &g;
  const auto nv = g.values().size();
  const auto ne = g.equations().size();
  p.constant.assign(nv, false);
  std::map<std::uint32_t, tensor_view> views;  // constant values' bytes
  for (const auto& l : g.literals()) {
    p.constant[l.value.index] = true;
    views.emplace(l.value.index, l.data.view());
  }
  for (const auto& w : g.weights()) {
    const auto v = weights(w.role);
    if (!v) return unexpected(compile_error{"weight " + w.role.str(), "the weight source has no tensor for this role"});
    if (v->type() != g.info(w.value).type.type || v->shape() != g.info(w.value).type.dims)
      return unexpected(compile_error{"weight " + w.role.str(), "stored as " + graph::tensor_type{v->type(), v->shape()}.str() +
                                                                    ", the graph expects " + g.info(w.value).type.str()});
    p.constant[w.value.index] = true;
    views.emplace(w.value.index, *v);
  }

  // Fold, in order: an equation whose inputs are all constant becomes a constant.
  for (std::size_t i = 0; i < ne; ++i) {
    const auto& e = g.equations()[i];
    // Communication is never folded: it happens at step time on every rank, whatever the target says.
    const bool talks = e.code == graph::op::all_reduce || e.code == graph::op::all_gather || e.code == graph::op::pipe_send ||
                       e.code == graph::op::pipe_recv;
    if (talks || !foldable(e)) continue;
    bool all = true;
    std::int64_t bytes = 0;
    std::vector<tensor_view> ins;
    for (auto v : e.inputs) {
      if (!p.constant[v.index]) { all = false; break; }
      ins.push_back(views.at(v.index));
      bytes += static_cast<std::int64_t>(ins.back().bytes());
    }
    const auto& ot = g.info(e.out).type;
    const auto out_bytes = storage_bytes(ot.type, static_cast<std::uint64_t>(ot.dims.numel()));
    if (!all || bytes > opt.max_folded_bytes || !out_bytes || static_cast<std::int64_t>(*out_bytes) > opt.max_folded_bytes) continue;
    auto t = evaluate_one(g, e, ins, "eqn " + std::to_string(i) + " (" + std::string(graph::op_name(e.code)) + ")");
    if (!t) return unexpected(t.error());
    p.constant[e.out.index] = true;
    auto [it, _] = p.folded.emplace(e.out.index, std::move(*t));
    views.emplace(e.out.index, it->second.view());
  }

  // Dead code: run what an output or a state output needs and is not constant.
  std::vector<bool> needed(nv, false);
  for (const auto& o : g.outputs()) needed[o.value.index] = true;
  for (const auto& s : g.states()) needed[s.out.index] = true;
  p.runs.assign(ne, false);
  for (std::size_t i = ne; i-- > 0;) {
    const auto& e = g.equations()[i];
    if (!needed[e.out.index] || p.constant[e.out.index]) continue;
    p.runs[i] = true;
    for (auto v : e.inputs) needed[v.index] = true;
  }
  // Folded values nothing reads are dropped.
  for (auto it = p.folded.begin(); it != p.folded.end();) it = needed[it->first] ? std::next(it) : p.folded.erase(it);

  p.last_use.assign(nv, -1);
  for (std::size_t i = 0; i < ne; ++i)
    if (p.runs[i])
      for (auto v : g.equations()[i].inputs) p.last_use[v.index] = static_cast<std::int64_t>(i);
  for (const auto& o : g.outputs()) p.last_use[o.value.index] = static_cast<std::int64_t>(ne);
  for (const auto& s : g.states()) p.last_use[s.out.index] = static_cast<std::int64_t>(ne);
  return p;
}

buffer_plan plan_buffers(const pruned_graph& p, const std::function<int(const graph::equation&)>& aliases) {
  const auto& g = *p.source;
  const auto nv = g.values().size();
  buffer_plan plan;
  plan.kind.assign(nv, storage::external);
  plan.offset.assign(nv, -1);
  plan.alias_of.assign(nv, graph::value_id::invalid_index);

  // The root of an alias chain carries the latest last use of every value sharing its bytes.
  std::vector<std::uint32_t> root(nv);
  for (std::uint32_t v = 0; v < nv; ++v) root[v] = v;
  std::vector<std::int64_t> end = p.last_use;
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    if (!p.runs[i]) continue;
    const auto& e = g.equations()[i];
    const int a = aliases(e);
    if (a < 0) continue;
    const auto in = e.inputs[static_cast<std::size_t>(a)].index;
    root[e.out.index] = root[in];
    end[root[in]] = std::max(end[root[in]], end[e.out.index]);
    plan.kind[e.out.index] = storage::alias;
    plan.alias_of[e.out.index] = in;
  }

  struct block { std::int64_t offset, bytes; };
  std::vector<block> free_list;
  auto allocate = [&](std::int64_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    for (auto it = free_list.begin(); it != free_list.end(); ++it) {
      if (it->bytes < bytes) continue;
      const auto at = it->offset;
      it->offset += bytes;
      it->bytes -= bytes;
      if (it->bytes == 0) free_list.erase(it);
      return at;
    }
    const auto at = plan.arena_bytes;
    plan.arena_bytes += bytes;
    return at;
  };
  auto release = [&](std::int64_t offset, std::int64_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    free_list.push_back({offset, bytes});
    std::sort(free_list.begin(), free_list.end(), [](const block& a, const block& b) { return a.offset < b.offset; });
    for (std::size_t i = 1; i < free_list.size();) {  // coalesce neighbours
      if (free_list[i - 1].offset + free_list[i - 1].bytes == free_list[i].offset) {
        free_list[i - 1].bytes += free_list[i].bytes;
        free_list.erase(free_list.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  };
  auto bytes_of = [&](std::uint32_t v) {
    const auto& t = g.info(graph::value_id{v}).type;
    return static_cast<std::int64_t>(*storage_bytes(t.type, static_cast<std::uint64_t>(t.dims.numel())));
  };
  // Values whose root dies at equation i, to release after it runs.
  std::map<std::int64_t, std::vector<std::uint32_t>> dies;
  auto place = [&](std::uint32_t v) {
    plan.kind[v] = storage::arena;
    plan.offset[v] = allocate(bytes_of(v));
    dies[end[v]].push_back(v);
  };
  for (const auto& s : g.slots())
    if (end[s.value.index] >= 0) place(s.value.index);
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    if (!p.runs[i]) continue;
    const auto out = g.equations()[i].out.index;
    if (plan.kind[out] != storage::alias) place(out);
    if (auto it = dies.find(static_cast<std::int64_t>(i)); it != dies.end()) {
      for (auto v : it->second) release(plan.offset[v], bytes_of(v));
      dies.erase(it);
    }
  }
  return plan;
}

}  // namespace troupe::compile

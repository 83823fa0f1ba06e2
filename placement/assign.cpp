#include "placement/assign.hpp"

#include <algorithm>
#include <numeric>

namespace troupe::placement {
namespace {

// A device with no declared memory is given this much, so the planner's arithmetic never overflows.
constexpr std::uint64_t unbounded_bytes = std::uint64_t{1} << 50;

std::vector<std::size_t> candidates(const std::vector<node_view>& nodes) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    if (n.excluded || n.devices.empty()) continue;
    if (n.max_replicas > 0 && n.hosted >= n.max_replicas) continue;
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (nodes[a].hosted_same != nodes[b].hosted_same) return nodes[a].hosted_same < nodes[b].hosted_same;
    return nodes[a].hosted < nodes[b].hosted;
  });
  return order;
}

node as_node(const node_view& v) {
  node n{v.id, v.devices};
  if (v.unbounded)
    for (auto& d : n.devices) d.memory_bytes = unbounded_bytes;
  return n;
}

// The stages of `p`'s first replica as assignments over `views` (`index[i]`: the view of inventory node i).
assignment from_plan(const plan& p, const inventory& inv, const std::vector<std::size_t>& index, std::int64_t tokens, std::uint64_t scratch) {
  assignment a;
  a.tensor_parallel = p.tensor_parallel;
  a.pipeline_parallel = p.pipeline;
  const auto& rep = p.replicas.front();
  a.kv_tokens = std::min(tokens, rep.kv_tokens);
  for (const auto& s : rep.stages) {
    stage_assignment sa;
    sa.node = index[s.devices.front().node];
    for (const auto& d : s.devices)
      sa.bytes.emplace_back(at(inv, d).name, scratch + s.weight_bytes + s.kv_bytes_per_token * static_cast<std::uint64_t>(a.kv_tokens));
    a.stages.push_back(std::move(sa));
  }
  a.description = describe(p, inv);
  return a;
}

// Stages on distinct nodes become a cross-node pipeline; all on one node, a local split.
bool normalise(assignment& a) {
  bool all_same = true, all_distinct = true;
  for (std::size_t i = 0; i < a.stages.size(); ++i)
    for (std::size_t j = i + 1; j < a.stages.size(); ++j) {
      if (a.stages[i].node == a.stages[j].node) all_distinct = false;
      else all_same = false;
    }
  if (all_same) {
    for (std::size_t i = 1; i < a.stages.size(); ++i)
      a.stages[0].bytes.insert(a.stages[0].bytes.end(), a.stages[i].bytes.begin(), a.stages[i].bytes.end());
    a.stages.resize(1);
    a.across_nodes = false;
    return true;
  }
  a.across_nodes = true;
  return all_distinct;
}

}  // namespace

std::uint64_t whole_replica_bytes(const requirements& r, std::int64_t tokens) {
  return r.scratch_bytes + static_cast<std::uint64_t>(r.layers) * r.layer_bytes + r.embedding_bytes + r.head_bytes +
         static_cast<std::uint64_t>(r.layers) * r.kv_bytes_per_token_per_layer * static_cast<std::uint64_t>(std::max<std::int64_t>(tokens, 0));
}

result<assignment, assign_error> assign_replica(const std::vector<node_view>& nodes, const replica_request& rq) {
  const auto order = candidates(nodes);
  if (order.empty()) return unexpected(assign_error{"every node is at its --max-replicas bound, draining or unavailable"});
  const std::int64_t want = std::max(rq.want_kv_tokens, rq.min_kv_tokens);

  // An explicit split: the operator's shape, on the nodes the order gives.
  if (rq.tensor_parallel > 1 || rq.pipeline_parallel > 1 || !rq.needs) {
    const std::int32_t tp = std::max(1, rq.tensor_parallel), pp = std::max(1, rq.pipeline_parallel);
    assignment a;
    a.tensor_parallel = tp;
    a.pipeline_parallel = pp;
    a.kv_tokens = want;
    if (rq.across_nodes && pp > 1) {
      if (order.size() < static_cast<std::size_t>(pp))
        return unexpected(assign_error{"a pipeline of " + std::to_string(pp) + " stages across nodes needs " + std::to_string(pp) +
                                       " nodes with room, " + std::to_string(order.size()) + " have it"});
      for (std::int32_t s = 0; s < pp; ++s) a.stages.push_back({order[static_cast<std::size_t>(s)], {}});
      a.across_nodes = true;
      a.description = "explicit split: " + std::to_string(pp) + " stages x " + std::to_string(tp) + " ranks across nodes";
      return a;
    }
    // One node: the first in the order whose free memory holds the whole replica (when it is known).
    for (auto i : order) {
      const auto& n = nodes[i];
      if (rq.needs && !n.unbounded) {
        const auto need = whole_replica_bytes(*rq.needs, want);
        std::uint64_t free = 0;
        for (const auto& d : n.devices) free += d.memory_bytes;
        if (need > free) continue;
        a.stages = {{i, {{n.devices.front().name, need}}}};
      } else {
        a.stages = {{i, {}}};
      }
      a.description = "whole replica on " + n.id + (tp * pp > 1 ? " (split " + std::to_string(tp) + " x " + std::to_string(pp) + ")" : "");
      return a;
    }
    const auto need = whole_replica_bytes(*rq.needs, want);
    return unexpected(assign_error{"device memory: no node has " + std::to_string(need) + " bytes free for a replica"});
  }

  policy pol;
  pol.goal = rq.goal;
  pol.replicas = 1;
  pol.min_kv_tokens = std::max<std::int64_t>(rq.min_kv_tokens, 1);
  pol.expert_parallel = rq.expert_parallel;
  // 2. a whole replica on one node, in anti-affinity order.
  std::string closest;
  for (auto i : order) {
    inventory inv{{as_node(nodes[i])}};
    auto p = make_plan(inv, *rq.needs, pol);
    if (!p) {
      if (closest.empty()) closest = nodes[i].id + ": " + p.error().message();
      continue;
    }
    auto a = from_plan(*p, inv, {i}, want, rq.needs->scratch_bytes);
    if (!normalise(a)) continue;
    return a;
  }
  // 3. the planner over every node with room: stages across nodes.
  inventory inv;
  std::vector<std::size_t> index;
  for (auto i : order) {
    inv.nodes.push_back(as_node(nodes[i]));
    index.push_back(i);
  }
  auto p = make_plan(inv, *rq.needs, pol);
  if (!p) return unexpected(assign_error{"device memory: " + (order.size() > 1 ? p.error().message() : closest)});
  auto a = from_plan(*p, inv, index, want, rq.needs->scratch_bytes);
  if (!normalise(a)) return unexpected(assign_error{"the plan mixes stages on one node with stages across nodes: " + a.description});
  return a;
}

}  // namespace troupe::placement

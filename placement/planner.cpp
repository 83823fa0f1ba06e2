#include "placement/planner.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

namespace troupe::placement {

std::string_view name(device_kind k) {
  switch (k) {
    case device_kind::cuda: return "cuda";
    case device_kind::cpu: return "cpu";
  }
  return "unknown";
}

std::string_view name(objective o) {
  switch (o) {
    case objective::latency: return "latency";
    case objective::capacity: return "capacity";
    case objective::throughput: return "throughput";
  }
  return "unknown";
}

std::string_view name(placement_error_code c) {
  switch (c) {
    case placement_error_code::bad_requirements: return "bad_requirements";
    case placement_error_code::bad_policy: return "bad_policy";
    case placement_error_code::bad_inventory: return "bad_inventory";
    case placement_error_code::no_devices: return "no_devices";
    case placement_error_code::heads_not_divisible: return "heads_not_divisible";
    case placement_error_code::does_not_fit: return "does_not_fit";
    case placement_error_code::replicas_do_not_fit: return "replicas_do_not_fit";
  }
  return "unknown";
}

std::string placement_error::message() const { return "placement: " + reason + " (" + std::string(name(code)) + ")"; }

const device& at(const inventory& inv, device_ref d) { return inv.nodes[d.node].devices[d.device]; }

link_kind link_between(device_ref a, device_ref b) { return a.node == b.node ? link_kind::same_node : link_kind::network; }

bool admissible_tensor_parallel(const requirements& req, std::int32_t tp) {
  if (tp < 1 || req.heads < 1 || req.kv_heads < 1) return false;
  return req.heads % tp == 0 && (req.kv_heads % tp == 0 || tp % req.kv_heads == 0);
}

std::int32_t kv_heads_per_rank(const requirements& req, std::int32_t tp) {
  if (tp < 1) return req.kv_heads;
  return (req.kv_heads + tp - 1) / tp;
}

namespace {

// Byte arithmetic is done in 128 bits: a stage's room goes negative while we look for the closest
// arrangement that does not fit, and layers x KV bytes x tokens passes 2^64 for absurd inputs. With
// bytes below 2^64, layers up to 2^16 and min_kv_tokens up to 2^40, a stage's need stays below 2^121;
// only the shortfall, summed over devices, saturates.
using wide = __int128;
constexpr wide wide_i64_max = std::numeric_limits<std::int64_t>::max();
constexpr wide wide_u64_max = std::numeric_limits<std::uint64_t>::max();
constexpr wide shortfall_cap = wide{1} << 122;

wide ceil_div(wide a, wide b) { return (a + b - 1) / b; }
std::uint64_t to_u64(wide v) {
  if (v <= 0) return 0;
  return v >= wide_u64_max ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(v);
}

std::string gib(wide bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string shape_name(device_kind kind, std::int32_t tp, std::int32_t pp) {
  return "pipeline " + std::to_string(pp) + " x tensor parallel " + std::to_string(tp) + " on " + std::string(name(kind));
}

unexpected<placement_error> fail(placement_error_code code, std::string reason) {
  return unexpected(placement_error{.code = code, .reason = std::move(reason)});
}

// What one rank of a stage holds at tensor-parallel degree tp (the rules in the header).
}  // namespace

std::uint64_t layer_bytes_per_rank(const requirements& req, std::int32_t tp, bool expert_parallel) {
  const wide t = std::max<std::int32_t>(tp, 1);
  if (!expert_parallel || req.experts < 1) return to_u64(ceil_div(req.layer_bytes, t));
  const wide experts = static_cast<wide>(req.experts) * req.expert_bytes;
  const wide rest = req.layer_bytes > experts ? static_cast<wide>(req.layer_bytes) - experts : 0;
  return to_u64(ceil_div(rest, t) + ceil_div(req.experts, t) * req.expert_bytes);
}

namespace {

struct shard_costs {
  wide layer = 0;      // weights of one layer
  wide embedding = 0;  // first stage only
  wide head = 0;       // last stage only
  wide kv = 0;         // KV of one token in one layer
  wide scratch = 0;
};

shard_costs costs_for(const requirements& req, std::int32_t tp, bool expert_parallel) {
  shard_costs c;
  c.layer = layer_bytes_per_rank(req, tp, expert_parallel);
  c.embedding = ceil_div(req.embedding_bytes, tp);
  c.head = ceil_div(req.head_bytes, tp);
  c.kv = ceil_div(static_cast<wide>(req.kv_bytes_per_token_per_layer) * kv_heads_per_rank(req, tp), req.kv_heads);
  c.scratch = req.scratch_bytes;
  return c;
}

// tp free devices of one kind on one node: the candidate for a stage. A node's free devices are sorted
// by memory (largest first, then by index) and cut into groups of tp, so each group's smallest device
// (which bounds every rank's shard) is as large as it can be; the leftover devices form no group.
struct group {
  std::size_t node = 0;
  std::size_t position = 0;          // among the node's groups, largest memory first
  std::vector<std::size_t> devices;  // indices on the node, ascending (rank order)
  std::uint64_t memory = 0;          // the smallest device's memory
};

using used_set = std::vector<std::vector<bool>>;  // [node][device]

std::vector<group> free_groups(const inventory& inv, device_kind kind, std::int32_t tp, const used_set& used) {
  std::vector<group> out;
  for (std::size_t n = 0; n < inv.nodes.size(); ++n) {
    const auto& devs = inv.nodes[n].devices;
    std::vector<std::size_t> free;
    for (std::size_t d = 0; d < devs.size(); ++d)
      if (devs[d].kind == kind && !used[n][d]) free.push_back(d);
    std::stable_sort(free.begin(), free.end(),
                     [&](std::size_t a, std::size_t b) { return devs[a].memory_bytes > devs[b].memory_bytes; });
    const std::size_t per = static_cast<std::size_t>(tp);
    for (std::size_t g = 0; g < free.size() / per; ++g) {
      group grp{.node = n, .position = g};
      const auto from = free.begin() + static_cast<std::ptrdiff_t>(g * per);
      grp.devices.assign(from, from + static_cast<std::ptrdiff_t>(per));
      grp.memory = devs[grp.devices.back()].memory_bytes;  // sorted largest first: the last is the smallest
      std::sort(grp.devices.begin(), grp.devices.end());
      out.push_back(std::move(grp));
    }
  }
  return out;
}

// Gives every stage one layer, then each further layer to the stage that `prefer` picks: the layer goes
// to s rather than t when prefer(s, l_s + 1, t, l_t + 1); ties go to the earlier stage. When each
// stage's score falls as it takes layers, this maximises the smallest score (every layer goes where the
// score after it stays highest).
template <class Prefer>
std::vector<std::int32_t> split_layers(std::size_t stages, std::int32_t layers, Prefer prefer) {
  std::vector<std::int32_t> l(stages, 1);
  for (std::int64_t placed = static_cast<std::int64_t>(stages); placed < layers; ++placed) {
    std::size_t best = 0;
    for (std::size_t s = 1; s < stages; ++s)
      if (prefer(s, l[s] + 1, best, l[best] + 1)) best = s;
    ++l[best];
  }
  return l;
}

// One replica laid out on chosen groups (in pipeline order).
struct arrangement {
  std::vector<group> stages;
  std::vector<std::int32_t> layers;  // per stage
  bool fits = false;
  wide shortfall = 0;                // !fits: bytes its devices lack, summed
  std::int64_t kv_tokens = 0;        // fits: tokens every device holds
};

arrangement arrange(const inventory& inv, const requirements& req, const shard_costs& c, std::vector<group> stages,
                    std::int64_t min_tokens) {
  arrangement a;
  a.stages = std::move(stages);
  const std::size_t n = a.stages.size();
  // Room for layers and KV on each stage's smallest device, after scratch and the embedding / head.
  std::vector<wide> room(n);
  for (std::size_t s = 0; s < n; ++s)
    room[s] = static_cast<wide>(a.stages[s].memory) - c.scratch - (s == 0 ? c.embedding : 0) - (s + 1 == n ? c.head : 0);

  // First: does it fit with min_tokens of KV? Each layer costs `per_layer` bytes on its stage; giving
  // each layer to the stage with the most room left maximises the smallest leftover (so it fits if any
  // split does) and, when nothing fits, adds the least to the summed shortfall.
  const wide per_layer = c.layer + static_cast<wide>(min_tokens) * c.kv;
  a.layers = split_layers(n, req.layers, [&](std::size_t s, std::int32_t ls, std::size_t t, std::int32_t lt) {
    return room[s] - ls * per_layer > room[t] - lt * per_layer;
  });
  a.fits = true;
  for (std::size_t s = 0; s < n; ++s)
    if (room[s] - a.layers[s] * per_layer < 0) a.fits = false;
  if (!a.fits) {
    for (std::size_t s = 0; s < n; ++s) {
      const wide need = c.scratch + (s == 0 ? c.embedding : 0) + (s + 1 == n ? c.head : 0) + a.layers[s] * per_layer;
      for (std::size_t d : a.stages[s].devices) {
        const wide lack = std::max<wide>(0, need - static_cast<wide>(inv.nodes[a.stages[s].node].devices[d].memory_bytes));
        a.shortfall = std::min(a.shortfall + lack, shortfall_cap);
      }
    }
    return a;
  }

  // Then: spread the layers for the most KV tokens, the smallest over stages of
  // (room - l * layer) / (l * kv). It falls with l (room >= l * per_layer >= 0 here), and comparing two
  // stages' scores cross-multiplies away the common kv > 0.
  a.layers = split_layers(n, req.layers, [&](std::size_t s, std::int32_t ls, std::size_t t, std::int32_t lt) {
    return (room[s] - ls * c.layer) * lt > (room[t] - lt * c.layer) * ls;
  });
  wide tokens = wide_i64_max;
  for (std::size_t s = 0; s < n; ++s) tokens = std::min(tokens, (room[s] - a.layers[s] * c.layer) / (a.layers[s] * c.kv));
  a.kv_tokens = static_cast<std::int64_t>(tokens);
  // The byte split fitted min_tokens and the token split maximises the smallest count, so this holds;
  // kept as a check on the two splits agreeing rather than trusted silently.
  if (a.kv_tokens < min_tokens) a.fits = false;
  return a;
}

// One replica shape tried on the inventory: as many replicas as fit, up to `limit`.
struct candidate {
  device_kind kind = device_kind::cpu;
  std::int32_t tp = 1;
  std::int32_t pp = 1;
  bool admissible = true;            // tp splits the heads (inadmissible shapes only explain refusals)
  std::vector<arrangement> replicas;
  wide shortfall = 0;                // no replica placed: what the first one lacks

  std::int64_t kv_tokens() const {
    std::int64_t t = std::numeric_limits<std::int64_t>::max();
    for (const auto& r : replicas) t = std::min(t, r.kv_tokens);
    return replicas.empty() ? 0 : t;
  }
  std::int64_t count() const { return static_cast<std::int64_t>(replicas.size()); }
};

// Places replicas of one shape one after another, each on the pp free groups with the most memory
// (ties: node order, then the node's group order), its stages in (node, group) order so stages on one
// node sit next to each other; stops at the first replica that does not fit.
candidate try_shape(const inventory& inv, const requirements& req, device_kind kind, std::int32_t tp, std::int32_t pp,
                    std::int64_t limit, std::int64_t min_tokens, bool expert_parallel) {
  // Expert parallelism splits the experts evenly (model::expert_parallel refuses a remainder).
  const bool even = !expert_parallel || req.experts < 1 || req.experts % tp == 0;
  candidate cand{.kind = kind, .tp = tp, .pp = pp, .admissible = admissible_tensor_parallel(req, tp) && even};
  const shard_costs costs = costs_for(req, tp, expert_parallel);
  used_set used(inv.nodes.size());
  for (std::size_t n = 0; n < inv.nodes.size(); ++n) used[n].assign(inv.nodes[n].devices.size(), false);

  while (cand.count() < limit) {
    std::vector<group> groups = free_groups(inv, kind, tp, used);
    if (groups.size() < static_cast<std::size_t>(pp)) break;
    std::stable_sort(groups.begin(), groups.end(), [](const group& a, const group& b) { return a.memory > b.memory; });
    groups.resize(static_cast<std::size_t>(pp));
    std::sort(groups.begin(), groups.end(),
              [](const group& a, const group& b) { return std::tie(a.node, a.position) < std::tie(b.node, b.position); });
    arrangement a = arrange(inv, req, costs, std::move(groups), min_tokens);
    if (!a.fits) {
      if (cand.replicas.empty()) cand.shortfall = a.shortfall;
      break;
    }
    for (const auto& g : a.stages)
      for (std::size_t d : g.devices) used[g.node][d] = true;
    cand.replicas.push_back(std::move(a));
  }
  return cand;
}

// The chosen candidate as a plan.
plan to_plan(const requirements& req, const candidate& cand, bool expert_parallel) {
  const shard_costs c = costs_for(req, cand.tp, expert_parallel);
  plan p{.kind = cand.kind, .tensor_parallel = cand.tp, .pipeline = cand.pp};
  for (const auto& a : cand.replicas) {
    replica r{.kv_tokens = a.kv_tokens};
    std::int32_t first = 0;
    const std::size_t n = a.stages.size();
    for (std::size_t s = 0; s < n; ++s) {
      stage st;
      for (std::size_t d : a.stages[s].devices) st.devices.push_back({.node = a.stages[s].node, .device = d});
      st.layers = {.first = first, .end = first + a.layers[s]};
      first = st.layers.end;
      st.weight_bytes = to_u64(a.layers[s] * c.layer + (s == 0 ? c.embedding : 0) + (s + 1 == n ? c.head : 0));
      st.kv_bytes_per_token = to_u64(a.layers[s] * c.kv);
      r.stages.push_back(std::move(st));
    }
    p.replicas.push_back(std::move(r));
  }
  return p;
}

result<void, placement_error> check(const inventory& inv, const requirements& req, const policy& pol) {
  using enum placement_error_code;
  if (req.layers < 1 || req.layers > max_layers)
    return fail(bad_requirements, "layers must be 1.." + std::to_string(max_layers) + ", got " + std::to_string(req.layers));
  if (req.heads < 1 || req.kv_heads < 1)
    return fail(bad_requirements, "heads and kv_heads must be at least 1, got " + std::to_string(req.heads) + " and " +
                                      std::to_string(req.kv_heads));
  if (req.heads % req.kv_heads != 0)
    return fail(bad_requirements,
                std::to_string(req.heads) + " heads are not a multiple of " + std::to_string(req.kv_heads) + " kv_heads");
  if (req.kv_bytes_per_token_per_layer == 0) return fail(bad_requirements, "kv_bytes_per_token_per_layer must be above 0");
  if (req.experts < 0 || (req.experts > 0 && req.expert_bytes > req.layer_bytes / static_cast<std::uint64_t>(req.experts)))
    return fail(bad_requirements, std::to_string(req.experts) + " experts of " + std::to_string(req.expert_bytes) + " bytes do not fit in a layer of " +
                                      std::to_string(req.layer_bytes) + " bytes");
  if (pol.expert_parallel && req.experts < 1) return fail(bad_policy, "expert parallelism needs a routed model (experts above 0)");
  if (pol.max_tensor_parallel && *pol.max_tensor_parallel < 1)
    return fail(bad_policy, "max_tensor_parallel must be at least 1, got " + std::to_string(*pol.max_tensor_parallel));
  if (pol.replicas && *pol.replicas < 1)
    return fail(bad_policy, "replicas must be at least 1, got " + std::to_string(*pol.replicas));
  if (pol.min_kv_tokens < 0 || pol.min_kv_tokens > max_kv_tokens)
    return fail(bad_policy, "min_kv_tokens must be 0.." + std::to_string(max_kv_tokens) + ", got " + std::to_string(pol.min_kv_tokens));
  std::set<std::string> ids;
  for (const auto& n : inv.nodes) {
    if (n.id.empty() || !ids.insert(n.id).second) return fail(bad_inventory, "node id '" + n.id + "' is empty or not unique");
    std::set<std::string> names;
    for (const auto& d : n.devices)
      if (d.name.empty() || !names.insert(d.name).second)
        return fail(bad_inventory, "device name '" + d.name + "' on node '" + n.id + "' is empty or not unique");
  }
  return {};
}

// The candidate a goal prefers among the feasible ones of one kind; nullptr when there is none.
const candidate* choose(const std::vector<const candidate*>& feasible, objective goal) {
  if (feasible.empty()) return nullptr;
  using key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;  // smaller is better
  auto key_of = [goal](const candidate& c) -> key {
    switch (goal) {
      case objective::latency: return {c.pp, -c.tp, -c.count(), -c.kv_tokens()};
      case objective::throughput: return {-c.count(), c.pp, -c.kv_tokens(), c.tp};
      case objective::capacity: return {c.pp, -c.tp, -c.kv_tokens(), 0};
    }
    return {};
  };
  std::int64_t best_kv = 0;
  for (const candidate* c : feasible) best_kv = std::max(best_kv, c->kv_tokens());
  const candidate* best = nullptr;
  for (const candidate* c : feasible) {
    // Capacity counts KV within 5% of the best as equal, so a deep pipeline does not win on rounding.
    if (goal == objective::capacity && static_cast<wide>(c->kv_tokens()) * 20 < static_cast<wide>(best_kv) * 19) continue;
    if (!best || key_of(*c) < key_of(*best)) best = c;
  }
  return best;
}

constexpr device_kind kinds_fastest_first[] = {device_kind::cuda, device_kind::cpu};

// Every shape of every kind (kinds fastest first, then tensor-parallel degree, then pipeline depth),
// inadmissible degrees included: they only explain a refusal.
std::vector<candidate> try_all_shapes(const inventory& inv, const requirements& req, const policy& pol, std::int64_t limit) {
  std::vector<candidate> cands;
  for (device_kind kind : kinds_fastest_first) {
    std::vector<std::int32_t> per_node;  // devices of this kind on each node
    for (const auto& n : inv.nodes)
      per_node.push_back(static_cast<std::int32_t>(
          std::count_if(n.devices.begin(), n.devices.end(), [&](const device& d) { return d.kind == kind; })));
    std::int32_t widest = *std::max_element(per_node.begin(), per_node.end());
    if (pol.max_tensor_parallel) widest = std::min(widest, *pol.max_tensor_parallel);
    for (std::int32_t tp = 1; tp <= widest; ++tp) {
      std::int64_t groups = 0;
      for (std::int32_t k : per_node) groups += k / tp;
      const std::int64_t deepest = std::min<std::int64_t>(groups, req.layers);  // a stage holds at least one layer
      for (std::int32_t pp = 1; pp <= deepest; ++pp) cands.push_back(try_shape(inv, req, kind, tp, pp, limit, pol.min_kv_tokens, pol.expert_parallel));
    }
  }
  return cands;
}

// Why no shape gave a plan, the most specific reason first: the replica count (some shape fits fewer),
// the heads (only degrees that cannot split them fit), else the memory the closest arrangement lacks.
placement_error explain_refusal(const std::vector<candidate>& cands, const requirements& req, const policy& pol,
                                std::int64_t wanted) {
  using enum placement_error_code;
  const candidate* most = nullptr;  // admissible, the most replicas (ties: fewer stages, narrower groups)
  for (const auto& c : cands)
    if (c.admissible && c.count() > 0 &&
        (!most || std::make_tuple(-c.count(), c.pp, c.tp) < std::make_tuple(-most->count(), most->pp, most->tp)))
      most = &c;
  if (most) {
    placement_error e{.code = replicas_do_not_fit};
    e.replicas_fit = static_cast<std::int32_t>(most->count());
    e.reason = std::to_string(wanted) + " replicas asked; at most " + std::to_string(most->count()) + " fit (" +
               shape_name(most->kind, most->tp, most->pp) + ")";
    return e;
  }

  const candidate* unsplittable = nullptr;  // inadmissible but fits: the smallest such degree
  for (const auto& c : cands)
    if (!c.admissible && c.count() > 0 && (!unsplittable || c.tp < unsplittable->tp)) unsplittable = &c;
  if (unsplittable) {
    placement_error e{.code = heads_not_divisible};
    e.tensor_parallel = unsplittable->tp;
    e.reason = "tensor parallel " + std::to_string(unsplittable->tp) + " would fit (" +
               shape_name(unsplittable->kind, unsplittable->tp, unsplittable->pp) + ") but cannot split " +
               std::to_string(req.heads) + " heads and " + std::to_string(req.kv_heads) +
               " KV heads, and no degree that splits them fits";
    return e;
  }

  const candidate* closest = nullptr;  // admissible, the least shortfall (ties: fewer stages, wider groups)
  for (const auto& c : cands)
    if (c.admissible && (!closest || std::make_tuple(c.shortfall, c.pp, -c.tp) <
                                         std::make_tuple(closest->shortfall, closest->pp, -closest->tp)))
      closest = &c;
  placement_error e{.code = does_not_fit};
  if (!closest) {  // unreachable: tensor parallel 1 x pipeline 1 is a shape of every kind present
    e.reason = "no device group can hold a stage";
    return e;
  }
  e.shortfall_bytes = to_u64(closest->shortfall);
  e.reason = "the model does not fit; the best arrangement (" + shape_name(closest->kind, closest->tp, closest->pp) +
             ") lacks " + std::to_string(e.shortfall_bytes) + " bytes (" + gib(closest->shortfall) +
             ") over its devices for weights, scratch and KV for " + std::to_string(pol.min_kv_tokens) +
             (pol.min_kv_tokens == 1 ? " token" : " tokens");
  return e;
}

}  // namespace

std::string describe(const plan& p, const inventory& inv) {
  std::string out = std::string(name(p.kind)) + ", pipeline " + std::to_string(p.pipeline) + " x tensor parallel " +
                    std::to_string(p.tensor_parallel) + ", " + std::to_string(p.replicas.size()) +
                    (p.replicas.size() == 1 ? " replica" : " replicas");
  for (std::size_t r = 0; r < p.replicas.size(); ++r) {
    out += "\nreplica " + std::to_string(r) + " (kv " + std::to_string(p.replicas[r].kv_tokens) + " tokens): ";
    for (std::size_t s = 0; s < p.replicas[r].stages.size(); ++s) {
      const stage& st = p.replicas[r].stages[s];
      if (s > 0) out += " | ";
      out += st.devices.empty() ? std::string("?") : inv.nodes[st.devices.front().node].id;
      out += "[";
      for (std::size_t i = 0; i < st.devices.size(); ++i) out += (i ? " " : "") + at(inv, st.devices[i]).name;
      out += "] layers [" + std::to_string(st.layers.first) + ", " + std::to_string(st.layers.end) + ")";
    }
  }
  return out;
}

result<plan, placement_error> make_plan(const inventory& inv, const requirements& req, const policy& pol) {
  if (auto ok = check(inv, req, pol); !ok) return unexpected(std::move(ok.error()));
  bool any = false;
  for (const auto& n : inv.nodes) any = any || !n.devices.empty();
  if (!any) return fail(placement_error_code::no_devices, "the inventory has no device");

  const std::int64_t wanted = pol.replicas.value_or(1);
  const std::int64_t limit = pol.replicas                         ? *pol.replicas
                             : pol.goal == objective::capacity ? 1
                                                               : std::numeric_limits<std::int64_t>::max();
  const std::vector<candidate> cands = try_all_shapes(inv, req, pol, limit);
  for (device_kind kind : kinds_fastest_first) {
    std::vector<const candidate*> feasible;
    for (const auto& c : cands)
      if (c.kind == kind && c.admissible && c.count() >= wanted) feasible.push_back(&c);
    if (const candidate* best = choose(feasible, pol.goal)) return to_plan(req, *best, pol.expert_parallel);
  }
  return unexpected(explain_refusal(cands, req, pol, wanted));
}

}  // namespace troupe::placement

#include "apps/plan.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>

#include "actors/model_needs.hpp"
#include "apps/cluster_cmd.hpp"
#include "apps/default_model.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"
#include "placement/planner.hpp"

namespace troupe::app {
namespace {

using actors::requirements_of;

// "a=cuda:80GiB*8,cpu:64GiB" -> a node.
result<placement::node, std::string> parse_node(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return unexpected("a node is ID=KIND:MEMORY[*COUNT][,...], got '" + text + "'");
  placement::node n;
  n.id = text.substr(0, eq);
  std::map<std::string, int> count_of;
  for (std::size_t at = eq + 1; at <= text.size();) {
    const auto comma = std::min(text.find(',', at), text.size());
    const std::string dev = text.substr(at, comma - at);
    at = comma + 1;
    const auto colon = dev.find(':');
    if (colon == std::string::npos) return unexpected("a device is KIND:MEMORY[*COUNT], got '" + dev + "'");
    const std::string kind = dev.substr(0, colon);
    std::string mem = dev.substr(colon + 1);
    int count = 1;
    if (const auto star = mem.find('*'); star != std::string::npos) {
      try {
        count = std::stoi(mem.substr(star + 1));
      } catch (...) {
        count = 0;
      }
      mem = mem.substr(0, star);
      if (count < 1 || count > 4096) return unexpected("a device count is 1 to 4096, got '" + dev + "'");
    }
    placement::device_kind k;
    if (kind == "cuda") k = placement::device_kind::cuda;
    else if (kind == "cpu") k = placement::device_kind::cpu;
    else return unexpected("a device kind is cuda or cpu, got '" + kind + "'");
    const auto bytes = parse_bytes(mem);
    if (!bytes || *bytes == 0) return unexpected("a device's memory is bytes or a size like 80GiB, got '" + mem + "'");
    for (int i = 0; i < count; ++i) {
      placement::device d;
      d.name = kind + ":" + std::to_string(count_of[kind]++);
      d.kind = k;
      d.memory_bytes = *bytes;
      n.devices.push_back(std::move(d));
    }
    if (comma == text.size()) break;
  }
  return n;
}

std::optional<placement::objective> objective_of(const std::string& goal) {
  if (goal == "latency") return placement::objective::latency;
  if (goal == "capacity") return placement::objective::capacity;
  if (goal == "throughput") return placement::objective::throughput;
  return std::nullopt;
}

bool stages_cross_nodes(const placement::plan& p) {
  for (const auto& r : p.replicas)
    for (std::size_t s = 1; s < r.stages.size(); ++s)
      if (r.stages[s].devices[0].node != r.stages[0].devices[0].node) return true;
  return false;
}

// The handle at `path` with its KV cache of the type named (f16 when empty), or why not.
result<std::shared_ptr<const families::model_handle>, std::string> typed_handle(const std::string& path, const std::string& kv_type) {
  auto h = families::model_handle::load(path, families::registry::builtin());
  if (!h) return unexpected(families::message(h.error()));
  auto typed = families::with_kv_type(*h, kv_type);
  if (!typed) return unexpected(families::message(typed.error()));
  return *typed;
}

}  // namespace

result<planned_split, std::string> plan_on_cluster(const std::string& model, const transport::cluster_status& status, const std::string& goal,
                                                   const std::string& kv_type) {
  const auto obj = objective_of(goal);
  if (!obj) return unexpected("--plan is latency, capacity or throughput, got '" + goal + "'");
  placement::inventory inv;
  for (const auto& n : status.nodes) {
    placement::node pn{n.id, {}};
    for (const auto& d : n.devices) {
      if (d.memory_bytes == 0)
        return unexpected("node '" + n.id + "' declared no device memory (troupe node --device-memory): the planner has nothing to fill");
      pn.devices.push_back({d.name, d.kind == transport::device_kind::cuda ? placement::device_kind::cuda : placement::device_kind::cpu, d.memory_bytes});
    }
    inv.nodes.push_back(std::move(pn));
  }
  if (inv.nodes.empty()) return unexpected(std::string("no node has joined"));
  auto h = typed_handle(model, kv_type);
  if (!h) return unexpected(h.error());
  auto req = requirements_of(**h);
  if (!req) return unexpected(req.error());
  placement::policy pol;
  pol.goal = *obj;
  auto plan = placement::make_plan(inv, *req, pol);
  if (!plan) return unexpected(plan.error().message());
  planned_split out;
  out.replicas = static_cast<int>(plan->replicas.size());
  out.tensor_parallel = plan->tensor_parallel;
  out.pipeline_parallel = plan->pipeline;
  out.across_nodes = stages_cross_nodes(*plan);
  out.description = placement::describe(*plan, inv);
  return out;
}

int run_plan(const plan_options& o) {
  auto path = model_or_default(o.model, "plan");
  if (!path) {
    std::fprintf(stderr, "%s\n", path.error().c_str());
    return 2;
  }
  auto h = typed_handle(*path, o.kv_type);
  if (!h) {
    std::fprintf(stderr, "troupe plan: %s\n", h.error().c_str());
    return 2;
  }
  auto req = requirements_of(**h);
  if (!req) {
    std::fprintf(stderr, "troupe plan: %s\n", req.error().c_str());
    return 2;
  }
  placement::inventory inv;
  for (const auto& t : o.nodes) {
    auto n = parse_node(t);
    if (!n) {
      std::fprintf(stderr, "troupe plan: %s\n", n.error().c_str());
      return 2;
    }
    inv.nodes.push_back(std::move(*n));
  }
  placement::policy pol;
  if (const auto obj = objective_of(o.goal)) {
    pol.goal = *obj;
  } else {
    std::fprintf(stderr, "troupe plan: --goal is latency, capacity or throughput, got '%s'\n", o.goal.c_str());
    return 2;
  }
  if (o.max_tensor_parallel > 0) pol.max_tensor_parallel = o.max_tensor_parallel;
  if (o.replicas > 0) pol.replicas = o.replicas;
  pol.min_kv_tokens = o.min_kv_tokens;
  pol.expert_parallel = o.expert_parallel;
  auto plan = placement::make_plan(inv, *req, pol);
  if (!plan) {
    std::fprintf(stderr, "troupe plan: %s\n", plan.error().message().c_str());
    return 1;
  }
  const bool across = stages_cross_nodes(*plan);
  std::string deploy = "troupe deploy --model " + *path + " --replicas " + std::to_string(plan->replicas.size()) +
                       (o.expert_parallel ? " --expert-parallel " : " --tensor-parallel ") +
                       std::to_string(plan->tensor_parallel) + " --pipeline-parallel " + std::to_string(plan->pipeline) + (across ? " --across-nodes" : "");
  if (o.json) {
    nlohmann::json j;
    j["model"] = *path;
    j["requirements"] = {{"layers", req->layers},     {"layer_bytes", req->layer_bytes}, {"embedding_bytes", req->embedding_bytes},
                         {"head_bytes", req->head_bytes}, {"kv_bytes_per_token_per_layer", req->kv_bytes_per_token_per_layer},
                         {"scratch_bytes", req->scratch_bytes}, {"heads", req->heads}, {"kv_heads", req->kv_heads},
                         {"experts", req->experts}, {"expert_bytes", req->expert_bytes}};
    j["layer_bytes_per_rank"] = placement::layer_bytes_per_rank(*req, plan->tensor_parallel, o.expert_parallel);
    j["kind"] = std::string(placement::name(plan->kind));
    j["tensor_parallel"] = plan->tensor_parallel;
    j["pipeline_parallel"] = plan->pipeline;
    j["across_nodes"] = across;
    j["replicas"] = nlohmann::json::array();
    for (const auto& r : plan->replicas) j["replicas"].push_back({{"kv_tokens", r.kv_tokens}, {"stages", r.stages.size()}});
    j["deploy"] = deploy;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s: %d layers of %.1f MiB, embedding %.1f MiB, head %.1f MiB, KV %llu bytes per token per layer, %d heads over %d KV heads\n",
              path->c_str(), req->layers, static_cast<double>(req->layer_bytes) / (1 << 20), static_cast<double>(req->embedding_bytes) / (1 << 20),
              static_cast<double>(req->head_bytes) / (1 << 20), static_cast<unsigned long long>(req->kv_bytes_per_token_per_layer), req->heads,
              req->kv_heads);
  if (req->experts > 0)
    std::printf("routed: %d experts of %.2f MiB a layer; %.2f MiB of a layer on the fullest rank (%s)\n", req->experts,
                static_cast<double>(req->expert_bytes) / (1 << 20),
                static_cast<double>(placement::layer_bytes_per_rank(*req, plan->tensor_parallel, o.expert_parallel)) / (1 << 20),
                o.expert_parallel ? "whole experts" : "every expert split by width");
  std::printf("%s\n", placement::describe(*plan, inv).c_str());
  std::printf("%s\n", deploy.c_str());
  return 0;
}

}  // namespace troupe::app

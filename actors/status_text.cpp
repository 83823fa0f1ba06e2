#include "actors/status_text.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>

namespace troupe::actors {

std::string status_json(const transport::cluster_status& s) {
  using nlohmann::json;
  json j;
  j["nodes"] = json::array();
  j["devices"] = json::array();
  for (const auto& n : s.nodes) {
    json devs = json::array();
    for (const auto& d : n.devices) {
      devs.push_back({{"name", d.name}, {"kind", std::string(transport::name(d.kind))}, {"memory_bytes", d.memory_bytes}});
      j["devices"].push_back({{"node", n.id}, {"name", d.name}, {"kind", std::string(transport::name(d.kind))}, {"memory_bytes", d.memory_bytes}});
    }
    j["nodes"].push_back({{"id", n.id}, {"state", n.state}, {"devices", devs}, {"replicas", n.replicas}, {"committed_bytes", n.committed_bytes}});
  }
  j["replicas"] = json::array();
  j["preparing"] = json::array();
  for (const auto& r : s.replicas) {
    const std::string node = r.nodes.empty() ? std::string() : r.nodes.back();
    json x = {{"id", r.id},
              {"model", r.model},
              {"node", node},
              {"node_name", node},
              {"nodes", r.nodes},
              {"devices", r.devices},
              {"state", std::string(transport::name(r.state))},
              {"outstanding", r.outstanding},
              {"load", r.outstanding},
              {"draining", r.state == transport::replica_state::draining},
              {"tensor_parallel", r.tensor_parallel},
              {"pipeline_parallel", r.pipeline_parallel},
              {"prepare_done", r.prepare_done},
              {"prepare_total", r.prepare_total}};
    j["replicas"].push_back(x);
    if (r.state == transport::replica_state::preparing)
      j["preparing"].push_back({{"id", r.id}, {"model", r.model}, {"node", node}, {"node_name", node}, {"done", r.prepare_done}, {"total", r.prepare_total}});
  }
  j["deployments"] = json::array();
  for (const auto& d : s.deployments)
    j["deployments"].push_back({{"name", d.name}, {"path", d.path}, {"family", d.family}, {"desired", d.desired}, {"serving", d.serving},
                                {"kv_type", d.kv_type}, {"kv_bytes_per_token", d.kv_bytes_per_token}, {"capacity", d.capacity},
                                {"kv_tokens", d.kv_tokens}, {"sequences_fit", d.capacity > 0 ? d.kv_tokens / d.capacity : 0}});
  j["jobs"] = s.jobs;
  j["refused"] = s.refused;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

std::string mib(std::uint64_t b) {
  if (b == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : sep) + x;
  return out;
}

}  // namespace

std::string status_table(const transport::cluster_status& s) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-20s %-9s %-28s %8s %12s\n", "NODE", "STATE", "DEVICES", "REPLICAS", "COMMITTED");
  out += line;
  for (const auto& n : s.nodes) {
    std::vector<std::string> devs;
    for (const auto& d : n.devices) devs.push_back(d.name + " " + mib(d.memory_bytes));
    std::snprintf(line, sizeof line, "%-20s %-9s %-28s %8d %12s\n", n.id.c_str(), n.state.c_str(), joined(devs, ", ").c_str(), n.replicas,
                  mib(n.committed_bytes).c_str());
    out += line;
  }
  out += "\n";
  std::snprintf(line, sizeof line, "%-8s %-20s %-10s %-24s %-8s %6s\n", "REPLICA", "MODEL", "STATE", "NODES", "SPLIT", "JOBS");
  out += line;
  for (const auto& r : s.replicas) {
    std::string state(transport::name(r.state));
    if (r.state == transport::replica_state::preparing && r.prepare_total > 0)
      state += " " + std::to_string(r.prepare_done) + "/" + std::to_string(r.prepare_total);
    const std::string split = std::to_string(r.pipeline_parallel) + "x" + std::to_string(r.tensor_parallel);
    std::snprintf(line, sizeof line, "%-8llu %-20s %-10s %-24s %-8s %6lld\n", static_cast<unsigned long long>(r.id), r.model.c_str(), state.c_str(),
                  joined(r.nodes, ",").c_str(), split.c_str(), static_cast<long long>(r.outstanding));
    out += line;
  }
  out += "\n";
  std::snprintf(line, sizeof line, "%-20s %-8s %-8s %-6s %-12s %-14s %s\n", "DEPLOYMENT", "SERVING", "DESIRED", "KV", "KV B/TOKEN",
                "SEQS FIT", "CHECKPOINT");
  out += line;
  for (const auto& d : s.deployments) {
    // Sequences of full capacity one replica's KV pool holds at once.
    const std::string fit = d.capacity > 0 ? std::to_string(d.kv_tokens / d.capacity) + " x " + std::to_string(d.capacity) : "-";
    std::snprintf(line, sizeof line, "%-20s %-8d %-8d %-6s %-12lld %-14s %s\n", d.name.c_str(), d.serving, d.desired, d.kv_type.c_str(),
                  static_cast<long long>(d.kv_bytes_per_token), fit.c_str(), d.path.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "\njobs %lld, refused %lld\n", static_cast<long long>(s.jobs), static_cast<long long>(s.refused));
  out += line;
  return out;
}

}  // namespace troupe::actors

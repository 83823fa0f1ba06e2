// What a process holding the coordinator's handle asks it (actor_internals.hpp): every replica's
// figures, the cluster's status and the served names.
#include <caf/all.hpp>

#include "actors/actor_internals.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {

std::string error_bytes(std::uint64_t job, transport::error_code code, std::string message, transport::retry r) {
  return transport::encode(transport::error{job, code, std::move(message), r});
}

// A query waits this long for the coordinator or a driver: a peer that stopped answering is noticed by
// heartbeats within seconds, so no query needs the 600 s a deployment may.
constexpr auto query_timeout = std::chrono::seconds(10);

// Every live replica's figures: the coordinator names the drivers, each driver answers for itself.
std::vector<transport::stats> collect_replica_stats(caf::actor_system& sys, const coordinator_actor& coordinator) {
  caf::scoped_actor self{sys};
  std::vector<caf::actor> drivers;
  self->request(coordinator, query_timeout, replicas_atom::value).receive([&](const std::vector<caf::actor>& v) { drivers = v; }, [](caf::error&) {});
  std::vector<transport::stats> out;
  for (const auto& d : drivers)
    self->request(d, query_timeout, stats_atom::value)
        .receive(
            [&](const std::string& b) {
              auto m = transport::decode(b);
              if (m && std::holds_alternative<transport::stats>(*m)) out.push_back(std::get<transport::stats>(*m));
            },
            [](caf::error&) {});
  return out;
}


result<transport::cluster_status, std::string> cluster_status_of(caf::actor_system& sys, const coordinator_actor& coordinator) {
  caf::scoped_actor self{sys};
  std::string bytes, err = "no answer";
  self->request(coordinator, std::chrono::seconds(30), status_atom::value)
      .receive([&](const std::string& b) { bytes = b; }, [&](caf::error& e) { err = sys.render(e); });
  if (bytes.empty()) return unexpected(err);
  auto m = transport::decode(bytes);
  if (!m || !std::holds_alternative<transport::cluster_status>(*m)) return unexpected(std::string("the coordinator's status did not decode"));
  return std::get<transport::cluster_status>(*m);
}

std::vector<std::string> served_models(caf::actor_system& sys, const coordinator_actor& coordinator) {
  std::vector<std::string> out;
  auto st = cluster_status_of(sys, coordinator);
  if (!st) return out;
  for (const auto& d : st->deployments) {
    if (d.serving == 0) continue;
    out.push_back(d.name);
    // Its LoRA adapters, as vLLM lists its LoRA modules: by name, and as SERVED:NAME.
    for (const auto& a : d.adapters) {
      out.push_back(a);
      out.push_back(d.name + ":" + a);
    }
  }
  return out;
}

}  // namespace troupe::actors

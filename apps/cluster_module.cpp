// The module's side of apps/cluster_module.hpp: the table of the cluster's commands.
#include "apps/cluster_module.hpp"

#include "apps/actor_bench.hpp"

#ifndef TROUPE_VERSION_STRING
#define TROUPE_VERSION_STRING "unknown"
#endif

extern "C" __attribute__((visibility("default"))) const troupe::app::cluster_module_api* troupe_cluster_module() {
  using namespace troupe::app;
  static const cluster_module_api api = [] {
    cluster_module_api a;
    a.version = TROUPE_VERSION_STRING;
    a.serve = &run_serve;
    a.sim = &troupe::cluster::run_sim;
    a.coordinator = &run_coordinator_cmd;
    a.node = &run_node_cmd;
    a.deploy = &run_deploy_cmd;
    a.submit = &run_submit_cmd;
    a.status = &run_status_cmd;
    a.gateway = &run_gateway_cmd;
    a.scale = &run_scale_cmd;
    a.top = &run_top_cmd;
    a.collectives = &run_collectives_cmd;
    a.certs = &run_certs_cmd;
    a.actor_bench = &run_actor_bench;
    return a;
  }();
  return &api;
}

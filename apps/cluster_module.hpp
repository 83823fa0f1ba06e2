#pragma once
// The cluster's commands run in a module the command line opens on first use: libtroupe-cluster.so,
// beside the binary in a build tree, in <libdir>/troupe/ once installed. They alone need CAF, Cap'n
// Proto, OpenSSL, cpp-httplib, Gloo and NCCL; a process that generates, benches, inspects or plans
// maps, relocates and initializes none of them (OpenSSL initializes itself at load, ~3 MB resident,
// because cpp-httplib's library asks it to). The module holds its own copy of the engine, every
// symbol of it hidden, so nothing crosses the boundary but these option structs.
#include <cstddef>
#include <cstdio>
#include <string>

#include "apps/bench.hpp"
#include "apps/cluster_cmd.hpp"
#include "apps/serve.hpp"
#include "cluster/sim.hpp"

namespace troupe::app {

struct cluster_module_api {
  // A module of another build is refused: the version and these sizes must equal the binary's.
  std::size_t api_size = sizeof(cluster_module_api);
  std::size_t options_size = sizeof(serve_options) + 3 * sizeof(cluster_cmd_options) + 5 * sizeof(bench_options) +
                             7 * sizeof(cluster::sim_options) + 11 * sizeof(speculation_flags);
  const char* version = nullptr;

  int (*serve)(const serve_options&) = nullptr;
  int (*sim)(const cluster::sim_options&) = nullptr;
  int (*coordinator)(const cluster_cmd_options&) = nullptr;
  int (*node)(const cluster_cmd_options&) = nullptr;
  int (*deploy)(const cluster_cmd_options&) = nullptr;
  int (*submit)(const cluster_cmd_options&) = nullptr;
  int (*status)(const cluster_cmd_options&) = nullptr;
  int (*gateway)(const cluster_cmd_options&) = nullptr;
  int (*scale)(const cluster_cmd_options&) = nullptr;
  int (*top)(const cluster_cmd_options&) = nullptr;
  int (*collectives)(const cluster_cmd_options&) = nullptr;
  int (*certs)(const std::string& action, const std::string& dir, const std::string& name, int days) = nullptr;
  int (*actor_bench)(const bench_options&) = nullptr;  // troupe bench --actors
};

// The entry point the module exports (extern "C", so dlsym finds it by this name).
inline constexpr const char* cluster_module_symbol = "troupe_cluster_module";
inline constexpr const char* cluster_module_file = "libtroupe-cluster.so";

// The module's functions, opened once per process. Null, with `error` naming each path tried and why
// it was refused, when no usable module is found; $TROUPE_CLUSTER_MODULE names one explicitly.
const cluster_module_api* cluster_module(std::string& error);

// Runs `command` (for the error message) through the module: its exit status, or 2 with a message on
// stderr when the module cannot be opened.
template <class F>
int through_cluster_module(const char* command, F&& call) {
  std::string error;
  const auto* m = cluster_module(error);
  if (!m) {
    std::fprintf(stderr, "troupe %s: the cluster module is not usable: %s\n", command, error.c_str());
    return 2;
  }
  return call(*m);
}

}  // namespace troupe::app

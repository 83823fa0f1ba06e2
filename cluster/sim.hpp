#pragma once
// `troupe sim`: a simulated cluster of node processes on loopback (cluster/sim.cpp).
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster {

struct sim_options {
  int nodes = 2;
  std::vector<std::string> models;  // checkpoints deployed, each on `replicas` replicas (the command line
                                    // puts the embedded model here when none is named)
  int replicas = 0;   // 0: one per node
  int threads = 1;    // compute threads per node
  std::int64_t max_rows = 16;
  std::int64_t capacity = 0;  // 0: the model's positions, at most 2048
  int heartbeat_ms = 500;
  int timeout_ms = 1500;
  std::string dir;    // logs and the secret; a temporary directory otherwise
  std::string device_memory;  // each node's simulated device, e.g. 8GiB; empty: no bound
};
int run_sim(const sim_options& o);

}  // namespace troupe::cluster

#pragma once
// troupe bench --actors: N jobs through a one-process actor cluster against the same driver directly
// (in the cluster module: apps/cluster_module.hpp).
#include "apps/bench.hpp"

namespace troupe::app {

int run_actor_bench(const bench_options& o);

}  // namespace troupe::app

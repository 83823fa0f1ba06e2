// `troupe serve`: a whole single-machine cluster in one process (coordinator, registry, a node, driver
// replicas on CPU executors) behind the OpenAI-compatible HTTP gateway. SIGINT or SIGTERM stops it:
// the gateway stops accepting, then the actors shut down.
#include "apps/serve.hpp"

#include <csignal>
#include <cstdio>

#include "actors/gateway.hpp"
#include "cluster/local_cluster.hpp"
#include "apps/default_model.hpp"

namespace troupe::app {

int run_serve(const serve_options& o) {
  const auto found = model_or_default(o.model, "serve");
  if (!found) {
    std::fprintf(stderr, "%s\n", found.error().c_str());
    return 2;
  }
  const std::string& model = *found;
  actors::gateway_options g;
  g.host = o.host;
  g.port = o.port;
  if (auto free = actors::port_available(o.host, o.port); !free) {
    std::fprintf(stderr, "troupe serve: %s\n", free.error().c_str());
    return 1;
  }
  if (!o.api_key_file.empty()) {
    auto keys = actors::read_api_keys(o.api_key_file);
    if (!keys) {
      std::fprintf(stderr, "troupe serve: %s\n", keys.error().c_str());
      return 2;
    }
    g.api_keys = std::move(*keys);
  } else {
    std::fprintf(stderr, "troupe serve: warning: no --api-key-file, so the HTTP API takes requests from anyone who can reach it\n");
  }
  // Signals are taken by this thread alone (sigwait), blocked everywhere else: the threads the
  // cluster and the gateway start inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  actors::cluster_options c;
  c.replicas = o.replicas;
  c.driver.max_rows = o.max_rows;
  c.driver.capacity = o.capacity;
  c.driver.prefill_chunk = 0;  // the node derives the chunk and the budget from the capacity
  c.driver.token_budget = 0;
  c.executor_threads = o.threads;
  if (o.expert_parallel > 1 && o.tensor_parallel > 1 && o.expert_parallel != o.tensor_parallel) {
    std::fprintf(stderr, "troupe serve: --expert-parallel spans the tensor-parallel group: give it %d, or leave --tensor-parallel out\n",
                 o.tensor_parallel);
    return 2;
  }
  c.tensor_parallel = std::max(o.tensor_parallel, o.expert_parallel);
  c.expert_parallel = o.expert_parallel > 1;
  c.kv_type = o.kv_type;
  c.mmproj = o.mmproj;
  c.pipeline_parallel = o.pipeline_parallel;
  c.max_outstanding = o.max_outstanding;
  for (const auto& m : o.lora_modules) {
    if (m.find('=') == std::string::npos || m.front() == '=' || m.back() == '=') {
      std::fprintf(stderr, "troupe serve: --lora-modules takes NAME=PATH, not '%s'\n", m.c_str());
      return 2;
    }
  }
  c.adapters = o.lora_modules;
  c.adapter_slots = o.max_loras;
  c.max_adapter_rank = o.max_lora_rank;
  if (o.speculation.any()) {
    auto sp = speculation_of(o.speculation, false);  // the node loads the draft checkpoint
    if (!sp) {
      std::fprintf(stderr, "troupe serve: %s\n", sp.error().c_str());
      return 2;
    }
    c.driver.speculation = *sp;
  }
  std::fprintf(stderr, "troupe serve: loading %s on %d replica(s)...\n", model.c_str(), o.replicas);
  auto cluster = actors::local_cluster::start(model, c);
  if (!cluster) {
    std::fprintf(stderr, "troupe serve: %s\n", cluster.error().c_str());
    return 1;
  }
  auto gw = actors::gateway::start(**cluster, model, g);
  if (!gw) {
    std::fprintf(stderr, "troupe serve: %s\n", gw.error().c_str());
    return 1;
  }
  std::printf("troupe serve: http://%s:%d/v1 serving '%s'\n", o.host.c_str(), (*gw)->port(), (*cluster)->model_name().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "troupe serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*gw)->stop();
  gw->reset();
  cluster->reset();
  return 0;
}

}  // namespace troupe::app

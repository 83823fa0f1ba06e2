#pragma once
// The actor layer's public face, free of CAF: a cluster in one process (coordinator, registry, one
// node, driver replicas on CPU executors) and the client facade that submits jobs through a client
// actor. Every message between the actors is a transport envelope (Cap'n Proto bytes), as it would be
// between processes; actors/detail/ holds the CAF side.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/driver/driver.hpp"
#include "transport/messages.hpp"

namespace troupe::actors {


// The end of a job: its tokens, text and logprobs in order, and how it ended.
struct job_result {
  std::uint64_t job_id = 0;
  std::vector<std::int32_t> tokens;
  std::string text;
  std::vector<transport::token_logprob> logprobs;
  std::string finish_reason;               // eos, stop_string, length, capacity, cancelled, deadline, ...
  std::optional<transport::error> error;   // set when the job failed or was refused
  transport::usage usage;
  std::int64_t chunks = 0;
  std::int32_t resumes = 0;               // times the job moved to another replica after losing its own
  std::uint64_t replica = 0;              // the replica that produced its last chunk (0: not said)
  double longest_gap_s = 0;               // the longest wait between two chunks (a resumed job's recovery)
  std::vector<float> embedding;           // an embed job's vector
  std::vector<transport::beam> beams;     // a beam search job's hypotheses, best first
};

struct job_stream;

// A submitted job's handle: pull chunks as they come, or wait for the end.
class job {
 public:
  std::uint64_t id() const { return id_; }
  // The next chunk, blocking; nullopt once the job has ended and every chunk was read.
  std::optional<transport::token_chunk> next();
  // Blocks until the job ends; returns everything it produced (chunks not yet pulled included).
  job_result wait();
  // Asks the cluster to stop the job; it ends with finish_reason "cancelled" within a step.
  void cancel();

 private:
  friend class client;
  std::uint64_t id_ = 0;
  std::shared_ptr<job_stream> stream_;
  std::shared_ptr<void> client_;  // keeps the client actor alive while the job is
};

struct client_state;
class client_set;

// A client session: one client actor in the cluster's actor system.
class client {
 public:
  ~client();
  // Returns when the coordinator admitted the job (a handle) or refused it (an error whose retry says
  // whether to try again: overloaded, or failed for a request that can never run).
  result<job, transport::error> submit(const transport::job_submit& request);

 private:
  friend class client_set;  // local_cluster and session open clients through it
  explicit client(std::shared_ptr<client_state> s) : s_(std::move(s)) {}
  std::shared_ptr<client_state> s_;
};

// What a gateway serves from: client sessions, replica figures, the model's name. A cluster in this
// process (local_cluster) or a connection to a remote coordinator (actors/remote.hpp's session).
class serving_backend {
 public:
  virtual ~serving_backend() = default;
  virtual std::unique_ptr<client> connect() = 0;
  virtual std::vector<transport::stats> replica_stats() = 0;
  virtual std::string model_name() const = 0;
  // The served names with at least one serving replica, as the coordinator knows them now.
  virtual std::vector<std::string> models() = 0;
  // Whether the coordinator is reachable (false at once when its link was lost).
  virtual bool healthy() { return true; }
  // Loads (a path on the serving nodes) or unloads (no path) a LoRA adapter in every replica of `model`
  // ("": the only deployment) while serving; why not, or "" when done (docs/adapters.md).
  virtual std::string adapter(const std::string& model, const std::string& name, const std::string& path) {
    (void)model, (void)name, (void)path;
    return "this server does not load adapters at run time";
  }
};

}  // namespace troupe::actors

#pragma once
// Rank fan-out: a tensor- or pipeline-parallel replica's ranks beyond rank 0 (in this process or
// another) run every step the sampling rank runs, with the same inputs, on threads kept for the
// driver's life. Private to engine/driver.
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/driver/driver.hpp"
#include "engine/driver/weight_source.hpp"

namespace troupe::driver {

inline auto key_tuple(const entry_key& k) {
  const auto& s = k.shape;
  return std::make_tuple(k.program, s.rows(), s.tokens(), s.capacity(), s.kv().kind, s.kv().block_size, s.kv().pool_blocks,
                         s.logits(), s.hidden_carry(), k.head, k.carried);
}
struct key_less {
  bool operator()(const entry_key& a, const entry_key& b) const { return key_tuple(a) < key_tuple(b); }
};

// A tensor-parallel rank beyond rank 0: its shard, executor and entries (keyed like rank 0's).
struct rank_state {
  std::shared_ptr<const families::model_handle> handle;
  exec::executor* ex = nullptr;
  std::shared_ptr<remote_rank> remote;  // a rank in another process: handle and ex unused
  std::unique_ptr<weight_map_source> weights;
  exec::executable_id exe{};
  std::map<entry_key, exec::entry_id, key_less> entries;
};

// The other ranks' threads: one per rank, started with the first step and kept for the driver's life,
// so a step costs a wake-up per rank rather than a thread start. `start` hands every rank the step;
// `wait` blocks until each has run it and returns the first refusal.
class rank_workers {
 public:
  explicit rank_workers(std::vector<rank_state>& ranks);
  rank_workers(const rank_workers&) = delete;
  ~rank_workers();
  void start(const entry_key& k, const exec::step_inputs& in);
  std::optional<exec::exec_error> wait();

 private:
  void loop(std::size_t r);

  std::vector<rank_state>& ranks_;
  std::vector<std::optional<exec::exec_error>> errors_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable go_, done_;
  entry_key key_;
  const exec::step_inputs* in_ = nullptr;
  std::size_t pending_ = 0;
  std::uint64_t round_ = 0;
  bool stopping_ = false;
};

// The other ranks' run of one step while the sampling rank runs on the caller's thread; `wait` (or the
// destructor) waits for them.
class others_run {
 public:
  others_run(rank_workers& w, const entry_key& k, const exec::step_inputs& in) : w_(w) { w_.start(k, in); }
  others_run(const others_run&) = delete;
  ~others_run() {
    if (!waited_) (void)w_.wait();
  }
  std::optional<exec::exec_error> wait() {
    waited_ = true;
    return w_.wait();
  }

 private:
  rank_workers& w_;
  bool waited_ = false;
};

}  // namespace troupe::driver

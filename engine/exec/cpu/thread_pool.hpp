#pragma once
// A persistent pool of worker threads, pinned one per core where the machine allows, that runs one
// data-parallel loop at a time. The calling thread takes part, so a pool of N runs on N threads.
// Tasks are handed out from a shared counter in chunks, and per-task outputs are the caller's to lay out
// without false sharing. Idle workers poll for a fraction of a millisecond (decode issues loops
// microseconds apart, and a dispatch to polling workers costs about 0.1 us) and then sleep.
#include <cstdint>
#include <functional>
#include <memory>

namespace troupe::exec::cpu {

struct thread_pool_options {
  int threads = 0;  // <= 0: one per available core
  // Pin worker t to the t-th CPU the process may use (the first is left to the calling thread). It
  // keeps caches warm; on a machine shared with other busy processes a pinned worker cannot move to a
  // free core, so a caller may turn it off.
  bool pin = true;
};

class thread_pool {
 public:
  // threads <= 0: one per available core.
  explicit thread_pool(int threads = 0);
  explicit thread_pool(const thread_pool_options& options);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const;
  // Runs fn(task, thread) for every task in [0, tasks) and returns when all are done; `thread` is in
  // [0, size()) and names per-thread scratch. Not reentrant: fn must not call parallel_for, and must
  // not throw. One caller at a time.
  void parallel_for(std::int64_t tasks, const std::function<void(std::int64_t task, int thread)>& fn);

 private:
  struct state;
  std::unique_ptr<state> s_;
};

}  // namespace troupe::exec::cpu

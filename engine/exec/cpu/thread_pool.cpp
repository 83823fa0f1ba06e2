#include "engine/exec/cpu/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace troupe::exec::cpu {
namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// The CPUs this process may run on, in order.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

// How long an idle worker polls for the next loop before it sleeps. Decode issues a loop every few
// microseconds, so a worker that went to sleep between them would add a futex wake-up to each; past
// this much idleness the work has paused and the core is better given back.
constexpr auto spin_budget = std::chrono::microseconds(400);

}  // namespace

// One loop at a time. `gen` is odd while a loop is open; a worker joins by raising `active` and
// re-reading `gen`, and the caller closes the loop (makes `gen` even) before waiting for `active` to
// drain. With both sides sequentially consistent, a worker either sees the close and leaves without
// touching the loop, or the caller sees it and waits: so the caller never waits on a sleeping worker,
// and the loop's fields are never read after parallel_for returns.
struct thread_pool::state {
  int threads = 1;
  std::vector<std::thread> workers;

  const std::function<void(std::int64_t, int)>* fn = nullptr;
  std::int64_t tasks = 0;
  std::int64_t chunk = 1;

  alignas(64) std::atomic<std::uint64_t> gen{0};
  alignas(64) std::atomic<std::int64_t> next{0};
  alignas(64) std::atomic<int> active{0};
  alignas(64) std::atomic<int> sleepers{0};
  std::atomic<bool> stop{false};
  std::mutex m;
  std::condition_variable cv;

  void run_tasks(int thread) {
    for (;;) {
      const std::int64_t first = next.fetch_add(chunk, std::memory_order_relaxed);
      if (first >= tasks) return;
      const std::int64_t last = std::min(first + chunk, tasks);
      for (std::int64_t t = first; t < last; ++t) (*fn)(t, thread);
    }
  }

  bool fresh(std::uint64_t g, std::uint64_t seen) const { return (g & 1u) != 0 && g != seen; }

  void worker(int thread) {
    std::uint64_t seen = 0;
    for (;;) {
      std::uint64_t g = gen.load(std::memory_order_acquire);
      if (!fresh(g, seen)) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 1;; ++i) {
          if (stop.load(std::memory_order_relaxed)) return;
          g = gen.load(std::memory_order_acquire);
          if (fresh(g, seen)) break;
          cpu_relax();
          if ((i & 255) == 0 && std::chrono::steady_clock::now() - start > spin_budget) {
            std::unique_lock lk(m);
            sleepers.fetch_add(1);
            cv.wait(lk, [&] {
              g = gen.load();
              return stop.load() || fresh(g, seen);
            });
            sleepers.fetch_sub(1);
            if (stop.load()) return;
            break;
          }
        }
      }
      active.fetch_add(1);
      if (gen.load() == g) {
        run_tasks(thread);
        seen = g;
      }
      active.fetch_sub(1, std::memory_order_release);
    }
  }
};

thread_pool::thread_pool(int threads) : thread_pool(thread_pool_options{.threads = threads}) {}

thread_pool::thread_pool(const thread_pool_options& options) : s_(std::make_unique<state>()) {
  int threads = options.threads;
  const std::vector<int> cpus = allowed_cpus();
  if (threads <= 0) {
    threads = cpus.empty() ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                           : static_cast<int>(cpus.size());
  }
  s_->threads = threads;
  // Workers take the allowed CPUs after the first, which is left to the calling thread. Pinning keeps
  // a worker's cache warm across loops; where the machine refuses it (or there are more threads than
  // CPUs) the workers float.
  const bool pin = options.pin && threads <= static_cast<int>(cpus.size());
  for (int t = 1; t < threads; ++t) {
    s_->workers.emplace_back([st = s_.get(), t] { st->worker(t); });
    if (pin) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[static_cast<std::size_t>(t)], &set);
      (void)pthread_setaffinity_np(s_->workers.back().native_handle(), sizeof(set), &set);
    }
  }
}

thread_pool::~thread_pool() {
  {
    std::lock_guard lk(s_->m);
    s_->stop.store(true);
  }
  s_->cv.notify_all();
  for (auto& w : s_->workers) w.join();
}

int thread_pool::size() const { return s_->threads; }

void thread_pool::parallel_for(std::int64_t tasks, const std::function<void(std::int64_t task, int thread)>& fn) {
  if (tasks <= 0) return;
  state& s = *s_;
  if (tasks == 1 || s.threads == 1) {
    for (std::int64_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
  s.fn = &fn;
  s.tasks = tasks;
  s.chunk = std::max<std::int64_t>(1, tasks / (16 * static_cast<std::int64_t>(s.threads)));
  s.next.store(0, std::memory_order_relaxed);
  const std::uint64_t open = s.gen.load(std::memory_order_relaxed) + 1;
  s.gen.store(open);
  if (s.sleepers.load() > 0) {
    { std::lock_guard lk(s.m); }
    s.cv.notify_all();
  }
  s.run_tasks(0);
  s.gen.store(open + 1);
  // A worker still in a task is usually microseconds from done; one the OS preempted may need this
  // core back, so a long wait yields it.
  for (int i = 1; s.active.load() != 0; ++i) {
    if (i % 4096 == 0) {
      std::this_thread::yield();
    } else {
      cpu_relax();
    }
  }
}

}  // namespace troupe::exec::cpu

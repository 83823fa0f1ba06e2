// The worker pool: every task runs exactly once per loop, thread ids name distinct threads, loops
// follow each other without losing or repeating work, and workers that went to sleep wake up.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/exec/cpu/thread_pool.hpp"

namespace troupe::exec::cpu {
namespace {

TEST(thread_pool, runs_every_task_once) {
  for (const int threads : {1, 2, 3}) {
    thread_pool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (const std::int64_t tasks : {0, 1, 2, 5, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(tasks));
      std::atomic<bool> bad_thread{false};
      pool.parallel_for(tasks, [&](std::int64_t t, int thread) {
        hits[static_cast<std::size_t>(t)].fetch_add(1);
        if (thread < 0 || thread >= threads) bad_thread = true;
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1) << "threads=" << threads << " tasks=" << tasks;
      EXPECT_FALSE(bad_thread);
    }
  }
}

TEST(thread_pool, unpinned_pool_runs_every_task) {
  thread_pool pool(thread_pool_options{.threads = 2, .pin = false});
  EXPECT_EQ(pool.size(), 2);
  std::atomic<std::int64_t> sum{0};
  pool.parallel_for(100, [&](std::int64_t t, int) { sum.fetch_add(t); });
  EXPECT_EQ(sum.load(), 99 * 100 / 2);
}

TEST(thread_pool, default_size_is_positive) {
  thread_pool pool;
  EXPECT_GE(pool.size(), 1);
}

// Many short loops back to back, as decode issues them: a worker that joined a loop late must not run
// a task of the next one, or count one twice.
TEST(thread_pool, back_to_back_loops) {
  thread_pool pool(2);
  std::vector<std::int64_t> sums(4, 0);
  std::int64_t total = 0;
  for (int loop = 0; loop < 20000; ++loop) {
    const std::int64_t tasks = 1 + loop % 7;
    std::atomic<std::int64_t> sum{0};
    pool.parallel_for(tasks, [&](std::int64_t t, int) { sum.fetch_add(t + 1 + loop); });
    total += sum.load() - (tasks * (tasks + 1) / 2 + tasks * loop);
  }
  EXPECT_EQ(total, 0);
}

// The per-thread index is exclusive while a loop runs: no two concurrent tasks share it.
TEST(thread_pool, thread_index_is_exclusive) {
  thread_pool pool(3);
  std::vector<std::atomic<int>> busy(3);
  std::atomic<bool> overlap{false};
  for (int loop = 0; loop < 200; ++loop) {
    pool.parallel_for(50, [&](std::int64_t, int thread) {
      if (busy[static_cast<std::size_t>(thread)].fetch_add(1) != 0) overlap = true;
      std::this_thread::yield();
      busy[static_cast<std::size_t>(thread)].fetch_sub(1);
    });
  }
  EXPECT_FALSE(overlap);
}

// Idle workers sleep after a while; the next loop must still get all its tasks done, and the pool
// must shut down cleanly while they sleep.
TEST(thread_pool, wakes_sleeping_workers) {
  thread_pool pool(2);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<int> n{0};
    pool.parallel_for(100, [&](std::int64_t, int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 100);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Both threads take part when the tasks are long enough to be shared.
TEST(thread_pool, uses_the_workers) {
  thread_pool pool(2);
  std::atomic<int> seen_worker{0};
  for (int attempt = 0; attempt < 50 && seen_worker.load() == 0; ++attempt) {
    pool.parallel_for(8, [&](std::int64_t, int thread) {
      if (thread == 1) seen_worker = 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  EXPECT_EQ(seen_worker.load(), 1);
}

// Two pools driven from two threads at once do not interfere.
TEST(thread_pool, independent_pools) {
  thread_pool a(2), b(2);
  std::atomic<std::int64_t> sa{0}, sb{0};
  std::thread ta([&] {
    for (int i = 0; i < 2000; ++i) a.parallel_for(4, [&](std::int64_t t, int) { sa.fetch_add(t); });
  });
  std::thread tb([&] {
    for (int i = 0; i < 2000; ++i) b.parallel_for(4, [&](std::int64_t t, int) { sb.fetch_add(t); });
  });
  ta.join();
  tb.join();
  EXPECT_EQ(sa.load(), 2000 * 6);
  EXPECT_EQ(sb.load(), 2000 * 6);
}

}  // namespace
}  // namespace troupe::exec::cpu

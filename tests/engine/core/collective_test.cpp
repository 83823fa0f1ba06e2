// The in-process collective (simulated devices on threads): sums in rank order, the same bits on every
// rank, repeated rounds compose, and a rank that never arrives is a bounded error for the others.
#include <gtest/gtest.h>

#include <thread>

#include "engine/core/collective.hpp"

namespace troupe {
namespace {

TEST(local_group, every_rank_gets_the_sum_over_many_rounds) {
  for (int size : {1, 2, 3, 4}) {
    auto g = local_group(size);
    ASSERT_EQ(g.size(), static_cast<std::size_t>(size));
    std::vector<std::vector<float>> data(static_cast<std::size_t>(size));
    std::vector<std::thread> ts;
    std::vector<int> bad(static_cast<std::size_t>(size), 0);
    for (int r = 0; r < size; ++r)
      ts.emplace_back([&, r] {
        for (int round = 0; round < 50; ++round) {
          std::vector<float> x(7 + round % 3);
          for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(r + 1) * static_cast<float>(i + round);
          if (!g[static_cast<std::size_t>(r)]->all_reduce_sum(x)) ++bad[r];
          for (std::size_t i = 0; i < x.size(); ++i)
            if (x[i] != static_cast<float>(size * (size + 1) / 2) * static_cast<float>(i + round)) ++bad[r];
        }
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < size; ++r) EXPECT_EQ(bad[r], 0) << "size " << size << " rank " << r;
  }
}

TEST(local_group, all_gather_puts_each_ranks_block_in_rank_order) {
  constexpr int size = 3;
  auto g = local_group(size);
  std::vector<std::vector<float>> all(size, std::vector<float>(size * 4, -1.0f));
  std::vector<std::thread> ts;
  std::vector<int> ok(size, 0);
  for (int r = 0; r < size; ++r)
    ts.emplace_back([&, r] {
      const std::vector<float> mine{10.0f * r, 10.0f * r + 1, 10.0f * r + 2, 10.0f * r + 3};
      ok[r] = g[static_cast<std::size_t>(r)]->all_gather(mine, all[static_cast<std::size_t>(r)]).has_value();
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(ok[r]);
    for (int b = 0; b < size; ++b)
      for (int i = 0; i < 4; ++i) EXPECT_EQ(all[r][b * 4 + i], 10.0f * b + i) << "rank " << r;
  }
  std::vector<float> mine(4), wrong(5);
  EXPECT_FALSE(g[0]->all_gather(mine, wrong));  // refused before it waits
}

TEST(local_group, a_missing_rank_is_a_timeout_and_breaks_the_group) {
  auto g = local_group(2, std::chrono::milliseconds(100));
  std::vector<float> x(4, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = g[0]->all_reduce_sum(x);
  ASSERT_FALSE(r);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(r.error().find("waited"), std::string::npos) << r.error();
  EXPECT_FALSE(g[1]->all_reduce_sum(x));  // broken for everyone
}

TEST(local_group, different_lengths_are_refused) {
  auto g = local_group(2);
  std::vector<float> a(4, 1.0f), b(5, 1.0f);
  result<void, std::string> ra, rb;
  std::thread t([&] { rb = g[1]->all_reduce_sum(b); });
  ra = g[0]->all_reduce_sum(a);
  t.join();
  EXPECT_FALSE(ra && rb);
}

}  // namespace
}  // namespace troupe

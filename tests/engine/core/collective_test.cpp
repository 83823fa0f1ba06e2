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

// The in-process pipe: a pair's messages arrive in order and whole; a sender does not wait for its
// receiver; a receiver with nothing sent times out; a length that differs and a bad peer are refused.
TEST(local_group, send_and_recv_pass_a_pairs_messages_in_order) {
  auto g = local_group(3, std::chrono::milliseconds(200));
  for (int m = 0; m < 3; ++m) {
    const std::vector<float> msg(static_cast<std::size_t>(4 + m), static_cast<float>(m));
    ASSERT_TRUE(g[0]->send(msg, 2));
  }
  std::thread other([&] {
    const std::vector<float> from1(2, 9.0f);
    EXPECT_TRUE(g[1]->send(from1, 2));
  });
  other.join();
  std::vector<float> two(2);
  ASSERT_TRUE(g[2]->recv(two, 1));
  EXPECT_EQ(two, std::vector<float>(2, 9.0f));
  for (int m = 0; m < 3; ++m) {
    std::vector<float> in(static_cast<std::size_t>(4 + m), -1.0f);
    ASSERT_TRUE(g[2]->recv(in, 0));
    EXPECT_EQ(in, std::vector<float>(in.size(), static_cast<float>(m)));
  }
  std::vector<float> x(3);
  EXPECT_FALSE(g[0]->send(x, 0));  // not to itself
  EXPECT_FALSE(g[0]->recv(x, 3));  // no rank 3
  const auto t0 = std::chrono::steady_clock::now();
  auto waited = g[1]->recv(x, 0);  // nothing was sent
  ASSERT_FALSE(waited);
  EXPECT_NE(waited.error().find("waited"), std::string::npos) << waited.error();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(local_group, a_message_of_another_length_is_refused) {
  auto g = local_group(2, std::chrono::milliseconds(200));
  const std::vector<float> sent(5, 1.0f);
  ASSERT_TRUE(g[0]->send(sent, 1));
  std::vector<float> in(4);
  auto r = g[1]->recv(in, 0);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("expected 4"), std::string::npos) << r.error();
}

}  // namespace
}  // namespace troupe

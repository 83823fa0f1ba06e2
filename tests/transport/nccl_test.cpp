// The NCCL backend. Without a CUDA device (this project's CI machine) connecting is a typed refusal,
// never a crash; with devices, one rank per device in threads of this process: all_reduce, all_gather
// and broadcast give exact results (small integers, exact in f32), and the all-reduce bus bandwidth is
// printed (scripts/gpu-check runs this on a GPU machine).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "transport/collectives.hpp"

namespace troupe::transport {
namespace {

namespace fs = std::filesystem;

fs::path rendezvous() {
  const auto d = fs::temp_directory_path() / ("troupe-nccl-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

TEST(nccl, without_a_device_connecting_is_a_typed_refusal) {
  if (cuda_devices() > 0) GTEST_SKIP() << "this machine has CUDA devices: the refusal path is for machines without";
  nccl_options o;
  o.rendezvous_dir = rendezvous().string();
  auto c = connect_nccl(o);
  ASSERT_FALSE(c);
  EXPECT_TRUE(c.error().code == collective_error_code::invalid_argument || c.error().code == collective_error_code::connect_failed);
  EXPECT_FALSE(c.error().message().empty());
}

TEST(nccl, bad_arguments_are_typed_refusals) {
  nccl_options o;
  o.rank = 2;
  o.size = 2;
  o.rendezvous_dir = rendezvous().string();
  auto c = connect_nccl(o);
  ASSERT_FALSE(c);
  o.rank = 0;
  o.size = 1;
  o.rendezvous_dir = "/nonexistent/troupe";
  EXPECT_FALSE(connect_nccl(o));
}

TEST(nccl, ranks_on_every_device_reduce_gather_and_broadcast_exactly) {
  const int n = cuda_devices();
  if (n < 1) GTEST_SKIP() << "no CUDA device";
  const auto dir = rendezvous();
  std::vector<int> bad(static_cast<std::size_t>(n), 0);
  std::vector<double> seconds(static_cast<std::size_t>(n), 0);
  constexpr std::size_t big = 16u << 20;  // 64 MiB of floats, for the bandwidth figure
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      nccl_options o;
      o.rank = r;
      o.size = n;
      o.device = r;
      o.rendezvous_dir = dir.string();
      o.prefix = "exact";
      auto c = connect_nccl(o);
      if (!c) {
        std::fprintf(stderr, "rank %d: %s\n", r, c.error().message().c_str());
        bad[r] = 1;
        return;
      }
      std::vector<float> x(1000);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(r + 1) + static_cast<float>(i % 7);
      if (!(*c)->all_reduce_sum(x)) bad[r] += 10;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (x[i] != static_cast<float>(n * (n + 1) / 2) + static_cast<float>(n) * static_cast<float>(i % 7)) ++bad[r];
      std::vector<float> mine(5, static_cast<float>(r)), all(5 * static_cast<std::size_t>(n), -1.0f);
      if (!(*c)->all_gather(mine, all)) bad[r] += 100;
      for (int b = 0; b < n; ++b)
        for (int i = 0; i < 5; ++i) bad[r] += all[static_cast<std::size_t>(b * 5 + i)] != static_cast<float>(b);
      std::vector<float> y(9, r == 0 ? 3.5f : 0.0f);
      if (!(*c)->broadcast(y, 0)) bad[r] += 1000;
      for (float v : y) bad[r] += v != 3.5f;
      std::vector<float> z(big, 1.0f);
      (void)(*c)->all_reduce_sum(z);  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 5; ++k) (void)(*c)->all_reduce_sum(z);
      seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5;
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(bad[r], 0) << "rank " << r;
  const double bytes = static_cast<double>(big) * sizeof(float);
  std::printf("[ nccl ] %d rank(s): 64 MiB all-reduce in %.3f ms (host-staged), bus bandwidth %.1f GB/s\n", n, seconds[0] * 1e3,
              n > 1 ? bytes * 2.0 * (n - 1) / n / seconds[0] / 1e9 : 0.0);
}

}  // namespace
}  // namespace troupe::transport

// The CUDA recurrent kernels' thread code (recurrent_threads.hpp), run on the host: each block's
// threads as host threads, a warp's sums through a barrier, every launch's blocks in turn, against
// the double recurrence of engine/graph/recurrent_math.hpp (what the oracle runs). Rows: one carrying
// its state with a padding token at its end, one fresh after a padding token, a padding row and a row
// past the pool (flagged, written as padding); state rows of 16 to 256 floats (one to eight lanes'
// worth), groups and key heads shared by several heads, every kernel width the lowering accepts.
#include "engine/exec/cuda/recurrent_threads.hpp"

#include <gtest/gtest.h>

#include <array>
#include <barrier>
#include <cmath>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "engine/graph/recurrent_math.hpp"

namespace troupe::exec::cuda {
namespace {

namespace rt = recurrent_threads;
namespace rec = graph::recurrent;

// One host thread per CUDA thread of a block; a warp's 32 threads meet at a barrier to sum.
struct host_block {
  std::int64_t bx = 0, by = 0, threads = 0;
  std::vector<std::unique_ptr<std::barrier<>>> bars;
  std::vector<float> lanes;
  std::mutex flag_mutex;
};
struct host_ctx {
  host_block* b;
  std::int64_t t;
  std::int64_t block_x() const { return b->bx; }
  std::int64_t block_y() const { return b->by; }
  std::int64_t thread_x() const { return t; }
  std::int64_t block_dim_x() const { return b->threads; }
  float warp_sum(float v) const {
    float* w = b->lanes.data() + (t / 32) * 32;
    auto& bar = *b->bars[static_cast<std::size_t>(t / 32)];
    w[t % 32] = v;
    bar.arrive_and_wait();
    float s = 0;
    for (int l = 0; l < 32; ++l) s += w[l];
    bar.arrive_and_wait();
    return s;
  }
  void raise(step_flag* f, std::int32_t code, std::int32_t eqn, std::int64_t value, std::int64_t bound) const {
    std::lock_guard lock(b->flag_mutex);
    if (f->code == flag_none) *f = {code, eqn, value, bound};
  }
};

// Runs `body(ctx)` for every thread of every block of a grid (bx blocks along x, by along y).
template <class F>
void launch(std::int64_t gx, std::int64_t gy, std::int64_t threads, F&& body) {
  for (std::int64_t y = 0; y < gy; ++y)
    for (std::int64_t x = 0; x < gx; ++x) {
      host_block b;
      b.bx = x, b.by = y, b.threads = threads;
      for (std::int64_t w = 0; w < (threads + 31) / 32; ++w) b.bars.push_back(std::make_unique<std::barrier<>>(32));
      b.lanes.assign(static_cast<std::size_t>((threads + 31) / 32 * 32), 0.0f);
      std::vector<std::jthread> ts;
      for (std::int64_t t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          host_ctx cx{&b, t};
          body(cx);
        });
    }
}

struct rows_case {
  static constexpr std::int64_t R = 4, T = 5, S = 4;
  std::vector<std::int32_t> rows = {2, 0, -1, 7}, pos, write;
  rows_case() : pos(R * T), write(R * T) {
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t t = 0; t < T; ++t) {
        const bool real = (r == 0 && t < 4) || (r == 1 && t > 0) || r == 3;
        pos[static_cast<std::size_t>(r * T + t)] = static_cast<std::int32_t>(r == 0 ? 7 + t : (t > 0 ? t - 1 : 0));
        write[static_cast<std::size_t>(r * T + t)] = real ? static_cast<std::int32_t>(r * T + t) : -1;
      }
  }
  recurrent_rows rr() const { return {rows.data(), dtype::i32, pos.data(), write.data(), R, T, S}; }
  // The reference: row_fn(r, fresh, out) for each row the recurrence runs, zeros elsewhere.
  template <class F>
  std::vector<double> reference(std::int64_t per, F&& row_fn) const {
    std::vector<double> out(static_cast<std::size_t>(R * per), 0.0);
    for (std::int64_t r = 0; r < R; ++r) {
      const auto u = rec::use_of_row(rows[static_cast<std::size_t>(r)], S, write.data(), pos.data(), r, T);
      if (!u.skip && !u.bad) row_fn(r, u.fresh, out.data() + r * per);
    }
    return out;
  }
};

std::vector<float> random_floats(std::mt19937& rng, std::int64_t n, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<float>(u(rng));
  return v;
}

// Every output element written (the buffer starts at 99) and within `tol` of the reference.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(want[i])));
  EXPECT_LT(worst, tol);
}

void expect_flagged(const step_flag& f) {
  EXPECT_EQ(f.code, flag_state_row);
  EXPECT_EQ(f.eqn, 5);
  EXPECT_EQ(f.value, 7);
  EXPECT_EQ(f.bound, rows_case::S);
}

TEST(recurrent_threads, ssm_conv_is_the_recurrence) {
  std::mt19937 rng(3);
  const rows_case rc;
  const auto T = rc.T, R = rc.R, S = rc.S;
  for (std::int64_t K : {std::int64_t{2}, std::int64_t{3}, std::int64_t{4}, max_conv_kernel}) {
    SCOPED_TRACE(K);
    const std::int64_t C = 200, per = T * C + (K - 1) * C;
    const auto x = random_floats(rng, R * T * C), st = random_floats(rng, S * (K - 1) * C), w = random_floats(rng, C * K);
    std::vector<float> y(static_cast<std::size_t>(R * per), 99.0f);
    step_flag f;
    const auto rr = rc.rr();
    launch(rt::blocks_of(C, rt::conv_threads), R, rt::conv_threads,
           [&](host_ctx& cx) { rt::ssm_conv(cx, rr, x.data(), st.data(), w.data(), C, K, y.data(), &f, 5); });
    const auto want = rc.reference(per, [&](std::int64_t r, bool fresh, double* o) {
      std::vector<double> win(static_cast<std::size_t>(K * C));
      const float* s0 = fresh ? nullptr : st.data() + rc.rows[static_cast<std::size_t>(r)] * (K - 1) * C;
      rec::ssm_conv_row<double>(x.data() + r * T * C, s0, w.data(), rc.write.data() + r * T, T, C, K, o, win.data());
    });
    expect_close(y, want, 1e-5);
    expect_flagged(f);
  }
}

TEST(recurrent_threads, ssm_scan_is_the_recurrence) {
  std::mt19937 rng(5);
  const rows_case rc;
  const auto T = rc.T, R = rc.R, S = rc.S;
  for (const auto& [H, P, G, N] : {std::array<std::int64_t, 4>{4, 3, 2, 40}, {8, 5, 1, 16}, {2, 2, 2, 128}, {6, 4, 3, 256}}) {
    SCOPED_TRACE(N);
    const std::int64_t per = T * H * P + H * P * N;
    const auto x = random_floats(rng, R * T * H * P), dt = random_floats(rng, R * T * H), A = random_floats(rng, H, -2, -0.1),
               B = random_floats(rng, R * T * G * N), Cm = random_floats(rng, R * T * G * N), st = random_floats(rng, S * H * P * N);
    std::vector<float> y(static_cast<std::size_t>(R * per), 99.0f);
    step_flag f;
    const auto rr = rc.rr();
    launch(rt::blocks_of(H * P, rt::warps_per_block), R, rt::warps_per_block * 32, [&](host_ctx& cx) {
      rt::ssm_scan(cx, rr, x.data(), dt.data(), A.data(), B.data(), Cm.data(), st.data(), H, P, G, N, y.data(), &f, 5);
    });
    const auto want = rc.reference(per, [&](std::int64_t r, bool fresh, double* o) {
      const float* s0 = fresh ? nullptr : st.data() + rc.rows[static_cast<std::size_t>(r)] * H * P * N;
      rec::ssm_scan_row<double>(x.data() + r * T * H * P, dt.data() + r * T * H, A.data(), B.data() + r * T * G * N, Cm.data() + r * T * G * N, s0,
                                rc.write.data() + r * T, T, H, P, G, N, o, 0, H);
    });
    expect_close(y, want, 1e-5);
    expect_flagged(f);
  }
}

TEST(recurrent_threads, delta_rule_is_the_recurrence) {
  std::mt19937 rng(7);
  const rows_case rc;
  const auto T = rc.T, R = rc.R, S = rc.S;
  for (const auto& [Hk, Dk, H, Dv] : {std::array<std::int64_t, 4>{2, 48, 4, 6}, {1, 128, 4, 16}, {2, 256, 2, 3}, {3, 32, 6, 9}}) {
    SCOPED_TRACE(Dk);
    const std::int64_t per = T * H * Dv + H * Dv * Dk;
    const auto q = random_floats(rng, R * T * Hk * Dk, -0.2, 0.2), k = random_floats(rng, R * T * Hk * Dk, -0.2, 0.2),
               v = random_floats(rng, R * T * H * Dv), g = random_floats(rng, R * T * H, -1, 0), be = random_floats(rng, R * T * H, 0, 1),
               st = random_floats(rng, S * H * Dv * Dk);
    std::vector<float> y(static_cast<std::size_t>(R * per), 99.0f);
    step_flag f;
    const auto rr = rc.rr();
    launch(rt::blocks_of(H * Dv, rt::warps_per_block), R, rt::warps_per_block * 32, [&](host_ctx& cx) {
      rt::delta_rule(cx, rr, q.data(), k.data(), v.data(), g.data(), be.data(), st.data(), Hk, Dk, H, Dv, y.data(), &f, 5);
    });
    const auto want = rc.reference(per, [&](std::int64_t r, bool fresh, double* o) {
      const float* s0 = fresh ? nullptr : st.data() + rc.rows[static_cast<std::size_t>(r)] * H * Dv * Dk;
      rec::delta_rule_row<double>(q.data() + r * T * Hk * Dk, k.data() + r * T * Hk * Dk, v.data() + r * T * H * Dv, g.data() + r * T * H,
                                  be.data() + r * T * H, s0, rc.write.data() + r * T, T, Hk, Dk, H, Dv, o, 0, H);
    });
    expect_close(y, want, 1e-5);
    expect_flagged(f);
  }
}

}  // namespace
}  // namespace troupe::exec::cuda

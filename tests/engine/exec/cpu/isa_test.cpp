// Run-time isa detection: names round-trip, the levels are ordered and consistent with the feature
// bits, and TROUPE_CPU_ISA can only lower the level.
#include <gtest/gtest.h>

#include "engine/exec/cpu/isa.hpp"

namespace troupe::exec::cpu {
namespace {

TEST(isa, names_round_trip) {
  for (const isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    EXPECT_EQ(isa_from_name(isa_name(level)), level);
  }
  EXPECT_FALSE(isa_from_name("avx").has_value());
  EXPECT_FALSE(isa_from_name("").has_value());
}

TEST(isa, levels_follow_features) {
  const cpu_features& f = features();
  const isa d = detected_isa();
  if (d >= isa::avx2) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
  if (d == isa::avx512) {
    EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni);
  }
  if (has_bf16_dot()) {
    EXPECT_EQ(d, isa::avx512);
    EXPECT_TRUE(f.avx512_bf16);
  }
  EXPECT_LE(best_isa(), d);
  EXPECT_TRUE(usable(isa::scalar));
  EXPECT_TRUE(usable(best_isa()));
  EXPECT_EQ(usable(isa::avx512), best_isa() == isa::avx512);
}

TEST(isa, request_only_lowers) {
  EXPECT_EQ(apply_isa_request(isa::avx512, "avx2"), isa::avx2);
  EXPECT_EQ(apply_isa_request(isa::avx512, "scalar"), isa::scalar);
  EXPECT_EQ(apply_isa_request(isa::avx2, "avx512"), isa::avx2);
  EXPECT_EQ(apply_isa_request(isa::avx2, "bogus"), isa::avx2);
  EXPECT_EQ(apply_isa_request(isa::scalar, "avx2"), isa::scalar);
}

}  // namespace
}  // namespace troupe::exec::cpu

// The CUDA target's weight-format math, run on the host: the very functions linear_kernels.cu calls,
// against the reference decoder (troupe::dequantize_row), the narrow-float converters of half.hpp and
// double-precision dot products. The GEMV is emulated thread by thread in the kernel's order.
#include "engine/exec/cuda/quant_math.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.hpp"
#include "engine/core/half.hpp"
#include "engine/core/quant.hpp"

namespace troupe::exec::cuda::quant {
namespace {

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// Equal bit for bit, or both NaN (a NaN's payload depends on which operand the host FPU passes on).
::testing::AssertionResult same_float(float got, float want) {
  if (bits(got) == bits(want) || (std::isnan(got) && std::isnan(want))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << " (0x" << std::hex << bits(got) << "), want " << want << " (0x"
                                       << bits(want) << ")";
}

// Reads like byte_loader and counts every broken promise of alignment: the kernels' loader turns those
// promises into 2-, 4-, 8- and 16-byte loads.
struct checked_loader {
  bool xvec = false;
  mutable int misaligned = 0;
  void check(const void* p, int align) const {
    if (reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(align) != 0) ++misaligned;
  }
  std::uint32_t u8(const std::uint8_t* p) const { return p[0]; }
  template <int Align>
  std::uint32_t u16(const std::uint8_t* p) const {
    static_assert(Align >= 1 && Align <= 16 && std::has_single_bit(static_cast<unsigned>(Align)));
    check(p, Align);
    return byte_loader{}.u16<Align>(p);
  }
  template <int Align, int N>
  void words(const std::uint8_t* p, std::uint32_t (&w)[N]) const {
    static_assert(Align >= 1 && Align <= 16 && std::has_single_bit(static_cast<unsigned>(Align)));
    check(p, Align);
    byte_loader{}.words<Align, N>(p, w);
  }
  void x8(const float* p, float (&v)[8]) const {
    if (xvec) check(p, 16);
    byte_loader{}.x8(p, v);
  }
};

// A byte buffer whose data starts `offset` bytes past a 64-byte boundary.
class placed_bytes {
 public:
  placed_bytes(std::size_t n, std::size_t offset) : store_(n + 128), offset_(offset) {
    const auto a = reinterpret_cast<std::uintptr_t>(store_.data());
    start_ = static_cast<std::size_t>((64 - a % 64) % 64) + offset_;
  }
  std::uint8_t* data() { return store_.data() + start_; }

 private:
  std::vector<std::uint8_t> store_;
  std::size_t offset_;
  std::size_t start_ = 0;
};

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

std::vector<float> reference_decode(dtype t, const std::uint8_t* src, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  const auto r = dequantize_row(t, reinterpret_cast<const std::byte*>(src), out.data(), n);
  EXPECT_TRUE(r.has_value());
  return out;
}

std::vector<std::uint8_t> encode(dtype t, const std::vector<float>& x) {
  std::vector<std::uint8_t> b(*storage_bytes(t, x.size()));
  const auto r = quantize_row(t, x.data(), reinterpret_cast<std::byte*>(b.data()), static_cast<std::int64_t>(x.size()));
  EXPECT_TRUE(r.has_value());
  return b;
}

std::vector<float> normal(std::mt19937_64& rng, std::size_t n, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- f16, bf16 and codes -------------------------------------------------------------------------

TEST(QuantMathHalf, WideningIsHalfHppForEveryPattern) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto v = static_cast<std::uint16_t>(h);
    ASSERT_EQ(bits(f16_bits_to_float(v)), bits(f16_to_f32(v))) << "f16 0x" << std::hex << h;
    ASSERT_EQ(bits(f16_bits_to_float_soft(v)), bits(f16_to_f32(v))) << "f16 0x" << std::hex << h;
    ASSERT_EQ(bits(bf16_bits_to_float(v)), bits(bf16_to_f32(v))) << "bf16 0x" << std::hex << h;
  }
}

TEST(QuantMathHalf, NarrowingIsHalfHpp) {
  std::vector<float> probes;
  // Every f16 value, the midpoints between neighbours (ties) and the floats either side of them.
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float a = f16_to_f32(static_cast<std::uint16_t>(h));
    probes.push_back(a);
    if (std::isfinite(a) && (h & 0x7fffu) != 0x7bffu) {
      const float b = f16_to_f32(static_cast<std::uint16_t>(h + 1));
      const float mid = static_cast<float>((static_cast<double>(a) + static_cast<double>(b)) / 2);  // exact
      probes.push_back(mid);
      probes.push_back(std::nextafter(mid, INFINITY));
      probes.push_back(std::nextafter(mid, -INFINITY));
    }
  }
  // The bf16 ties: every 16-bit prefix with its low half at the midpoint and either side.
  for (std::uint32_t h = 0; h < 0x10000u; ++h)
    for (std::uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x0001u, 0xffffu}) probes.push_back(std::bit_cast<float>((h << 16) | low));
  // A sweep over all float patterns, and the overflow edges.
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 4099) probes.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
  for (float f : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1p-26f, FLT_MAX,
                  std::numeric_limits<float>::denorm_min()}) {
    probes.push_back(f);
    probes.push_back(-f);
  }
  for (float f : probes) {
    ASSERT_EQ(float_to_f16_bits(f), f32_to_f16(f)) << "f32 0x" << std::hex << bits(f);
    ASSERT_EQ(float_to_f16_bits_soft(f), f32_to_f16(f)) << "f32 0x" << std::hex << bits(f);
    ASSERT_EQ(float_to_bf16_bits(f), f32_to_bf16(f)) << "f32 0x" << std::hex << bits(f);
  }
}

TEST(QuantMathHalf, CodesConvertExactly) {
  for (std::uint32_t v = 0; v < 256; ++v) {
    EXPECT_EQ(code_to_float<0>(v), static_cast<float>(v));
    EXPECT_EQ(code_to_float<8>(v), static_cast<float>(static_cast<int>(v) - 8));
    EXPECT_EQ(code_to_float<32>(v), static_cast<float>(static_cast<int>(v) - 32));
    EXPECT_EQ(code_to_float<128>(v), static_cast<float>(static_cast<int>(v) - 128));
    EXPECT_EQ(code_to_float<128>(v ^ 0x80u), static_cast<float>(static_cast<std::int8_t>(v)));  // an int8's bits
  }
  EXPECT_EQ(code_to_float<0>(0x7fffffu), 8388607.0f);
}

// ---- layouts, alignment ------------------------------------------------------------------------------

template <class F>
class QuantMathFormat : public ::testing::Test {};
using formats = ::testing::Types<fmt_f32, fmt_f16, fmt_bf16, fmt_q8_0, fmt_q4_0, fmt_q4_k, fmt_q6_k, fmt_iq4_nl, fmt_iq4_xs, fmt_q4_a32,
                                 fmt_q8_a32, fmt_fp8_s32, fmt_q4_1, fmt_q5_0, fmt_q5_1, fmt_q5_k, fmt_q2_k, fmt_q3_k, fmt_mxfp4>;
TYPED_TEST_SUITE(QuantMathFormat, formats);

TYPED_TEST(QuantMathFormat, LayoutIsTheDtypeTable) {
  using F = TypeParam;
  const auto& in = info(F::type);
  if constexpr (F::plain) {
    EXPECT_EQ(in.block_elems, 1u);
    EXPECT_EQ(in.block_bytes, static_cast<std::size_t>(F::elem_bytes));
    EXPECT_EQ(F::block_bytes, F::block_elems * F::elem_bytes);
  } else {
    EXPECT_EQ(in.block_elems, static_cast<std::size_t>(F::block_elems));
    EXPECT_EQ(in.block_bytes, static_cast<std::size_t>(F::block_bytes));
  }
  EXPECT_EQ(F::block_bytes % F::max_align, 0);
  EXPECT_EQ(F::max_align % F::mid_align, 0);
  bool seen = false;
  EXPECT_TRUE(with_format(F::type, [&](auto f) { seen = decltype(f)::type == F::type; }));
  EXPECT_TRUE(seen);
  // Every element of a block is in exactly one run of one piece.
  std::vector<int> hits(F::block_elems, 0);
  for (int p = 0; p < F::pieces; ++p)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i) ++hits.at(static_cast<std::size_t>(F::run_elem(p, h) + i));
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; }));
}

// The KV cache's device reads and writes (attention's staging, a q8_0 cache's cast): every element of
// an f16, bf16 or q8_0 row decodes as core's dequantize_row, and a q8_0 block is core's quantize_row
// byte for byte, zeros, NaN and a block at f16's range included.
TEST(QuantMathKv, ElementsAndQ8Blocks) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(32 * 6);
  for (auto& v : x) v = normal(rng);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;        // a zero block: d = 0, codes 0
  x[70] = std::numeric_limits<float>::quiet_NaN();  // a NaN's code is 0
  for (int j = 96; j < 128; ++j) x[j] = 60000.0f * (j % 2 ? 1.0f : -1.0f);
  for (const dtype t : {dtype::f16, dtype::bf16, dtype::q8_0}) {
    std::vector<std::byte> bytes(*storage_bytes(t, x.size()));
    ASSERT_TRUE(quantize_row(t, x.data(), bytes.data(), static_cast<std::int64_t>(x.size())));
    std::vector<float> want(x.size());
    ASSERT_TRUE(dequantize_row(t, bytes.data(), want.data(), static_cast<std::int64_t>(x.size())));
    for (std::size_t i = 0; i < x.size(); ++i)
      EXPECT_TRUE(same_float(kv_element(bytes.data(), t, static_cast<std::int64_t>(i)), want[i])) << name(t) << " element " << i;
    if (t != dtype::q8_0) continue;
    std::vector<std::uint8_t> mine(bytes.size());
    for (std::size_t b = 0; b < x.size() / 32; ++b) quantize_block_q8_0(x.data() + 32 * b, mine.data() + 34 * b);
    EXPECT_EQ(std::memcmp(mine.data(), bytes.data(), bytes.size()), 0);
  }
}

TEST(QuantMathLayout, OnlyTheKernelFormatsAreRead) {
  int supported = 0;
  for (int i = 0; i < dtype_count; ++i) supported += with_format(static_cast<dtype>(i), [](auto) {}) ? 1 : 0;
  EXPECT_EQ(supported, 19);
}

TEST(QuantMathLayout, AlignmentChoice) {
  EXPECT_EQ(common_align(0x1000, 0), 16);
  EXPECT_EQ(common_align(0x1000, 34 * 8), 16);
  EXPECT_EQ(common_align(0x1000, 34), 2);
  EXPECT_EQ(common_align(0x1004, 144), 4);
  EXPECT_EQ(common_align(0x1001, 144), 1);
  EXPECT_EQ(select_align<fmt_q4_k>(16), 16);
  EXPECT_EQ(select_align<fmt_q4_k>(8), 4);
  EXPECT_EQ(select_align<fmt_q4_k>(2), 1);
  EXPECT_EQ(select_align<fmt_q8_0>(16), 2);
  EXPECT_EQ(select_align<fmt_q6_k>(1), 1);
  EXPECT_EQ(select_align<fmt_f32>(8), 4);
  EXPECT_EQ(select_align<fmt_f16>(2), 2);
  EXPECT_TRUE(x_vector_ok(0x1000, 64));
  EXPECT_FALSE(x_vector_ok(0x1004, 64));
  EXPECT_FALSE(x_vector_ok(0x1000, 6));
  for (int mc = 1; mc <= gemv_max_m; ++mc) {
    const int pm = gemv_pass_m(mc);
    EXPECT_GE(pm, mc);
    with_pass_m(pm, [&](auto m) { EXPECT_EQ(decltype(m)::value, pm); });
  }
}

// ---- decoding ----------------------------------------------------------------------------------------

// Offsets of the f16 scale fields of a block.
template <class F>
std::vector<std::size_t> scale_fields() {
  if constexpr (F::type == dtype::q4_k || F::type == dtype::q5_k || F::type == dtype::q4_1 || F::type == dtype::q5_1) return {0, 2};
  else if constexpr (F::type == dtype::q6_k) return {208};
  else if constexpr (F::type == dtype::q2_k) return {80, 82};
  else if constexpr (F::type == dtype::q3_k) return {108};
  else if constexpr (F::type == dtype::mxfp4) return {};  // an E8M0 byte: the random rows reach every one
  else if constexpr (F::plain) return {};
  else return {0};
}

// Rows to decode: for the block formats quantized data at several magnitudes, the same with extreme
// f16 scales written in, and raw random bytes; for the plain formats random bit patterns.
template <class F>
std::vector<std::vector<std::uint8_t>> sample_rows(std::mt19937_64& rng) {
  std::vector<std::vector<std::uint8_t>> rows;
  std::uniform_int_distribution<int> byte(0, 255);
  auto random_bytes = [&](std::size_t n) {
    std::vector<std::uint8_t> b(n);
    for (auto& v : b) v = static_cast<std::uint8_t>(byte(rng));
    return b;
  };
  if constexpr (F::plain) {
    for (int i = 0; i < 8; ++i) rows.push_back(random_bytes(static_cast<std::size_t>(F::block_bytes) * 64));
  } else {
    const std::size_t elems = static_cast<std::size_t>(F::block_elems) * 16;
    for (float sigma : {1.0f, 1e-6f, 3e4f, 1e-30f}) rows.push_back(encode(F::type, normal(rng, elems, sigma)));
    auto spiky = normal(rng, elems, 1.0f);
    for (std::size_t i = 0; i < elems; i += 37) spiky[i] *= 1000.0f;
    rows.push_back(encode(F::type, spiky));
    rows.push_back(encode(F::type, std::vector<float>(elems, 0.0f)));
    rows.push_back(encode(F::type, std::vector<float>(elems, -2.5f)));
    const std::uint16_t extremes[] = {0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7c00, 0xfc00, 0x7e00, 0x7d01, 0x0000, 0x8000};
    auto special = encode(F::type, normal(rng, elems, 1.0f));
    std::size_t k = 0;
    for (std::size_t b = 0; b < special.size() / F::block_bytes; ++b)
      for (std::size_t at : scale_fields<F>()) {
        const std::uint16_t v = extremes[k++ % std::size(extremes)];
        special[b * F::block_bytes + at] = static_cast<std::uint8_t>(v & 0xff);
        special[b * F::block_bytes + at + 1] = static_cast<std::uint8_t>(v >> 8);
      }
    rows.push_back(special);
    for (int i = 0; i < 6; ++i) rows.push_back(random_bytes(static_cast<std::size_t>(F::block_bytes) * 64));
  }
  return rows;
}

TYPED_TEST(QuantMathFormat, BlocksDecodeToTheReferenceBitForBit) {
  using F = TypeParam;
  std::mt19937_64 rng(11);
  for (const auto& row : sample_rows<F>(rng)) {
    const auto blocks = static_cast<std::int64_t>(row.size() / F::block_bytes);
    const auto want = reference_decode(F::type, row.data(), blocks * F::block_elems);
    std::vector<float> got(want.size(), 0.0f);
    for (std::int64_t b = 0; b < blocks; ++b) decode_block<F>(row.data() + b * F::block_bytes, got.data() + b * F::block_elems);
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_TRUE(same_float(got[i], want[i])) << "element " << i;
  }
}

// The kernels' decode: rows of C weights at every alignment, item by item (pieces, then for the plain
// formats single elements); each element written once, with the reference's value, and every load as
// aligned as promised.
TYPED_TEST(QuantMathFormat, RowItemsCoverTheRowOnceAtAnyAlignment) {
  using F = TypeParam;
  std::mt19937_64 rng(12);
  const std::vector<std::int64_t> lengths =
      F::plain ? std::vector<std::int64_t>{1, 7, 16, 17, 40, 100, 333} : std::vector<std::int64_t>{F::block_elems, 3 * F::block_elems, 5 * F::block_elems};
  for (const std::int64_t C : lengths) {
    const std::int64_t rows = 3;
    const std::int64_t rb = row_bytes<F>(C);
    const std::size_t total = static_cast<std::size_t>(rb * rows);
    std::vector<std::uint8_t> data(total);
    if constexpr (F::plain) {
      for (auto& v : data) v = static_cast<std::uint8_t>(rng());
    } else {
      data = encode(F::type, normal(rng, static_cast<std::size_t>(C * rows), 1.0f));
    }
    const auto want = reference_decode(F::type, data.data(), C * rows);
    for (std::size_t offset : {0u, 1u, 2u, 4u, 8u, 16u, 34u}) {
      placed_bytes buf(total, offset);
      std::memcpy(buf.data(), data.data(), total);
      const int a = select_align<F>(common_align(addr(buf.data()), static_cast<std::uint64_t>(rb)));
      checked_loader ld;
      std::vector<float> got(want.size(), 0.0f);
      std::vector<int> writes(want.size(), 0);
      with_align<F>(a, [&](auto al) {
        for (std::int64_t j = 0; j < rows; ++j) {
          for (std::int64_t it = 0; it < decode_items<F>(C); ++it) {
            std::int64_t first[2];
            float v[2][8];
            const int n = decode_item<F, decltype(al)::value>(ld, buf.data() + j * rb, C, it, first, v);
            ASSERT_TRUE(n == 8 || n == 1);
            for (int h = 0; h < (n == 8 ? 2 : 1); ++h)
              for (int i = 0; i < n; ++i) {
                const auto e = static_cast<std::size_t>(j * C + first[h] + i);
                ASSERT_LT(static_cast<std::int64_t>(first[h] + i), C);
                got.at(e) = v[h][i];
                ++writes.at(e);
              }
          }
        }
      });
      EXPECT_EQ(ld.misaligned, 0) << "C " << C << " offset " << offset << " align " << a;
      for (std::size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(writes[i], 1) << "C " << C << " element " << i;
        ASSERT_TRUE(same_float(got[i], want[i])) << "C " << C << " element " << i;
      }
    }
  }
}

// ---- dot products ------------------------------------------------------------------------------------

// gamma_n = n u / (1 - n u), u = 2^-24: the bound on the relative error of n roundings in sequence.
// A sum computed by roundings along paths of depth at most n is within gamma_n * sum(|terms|) of exact.
double gamma(int n) {
  const double nu = n * 0x1p-24;
  return nu / (1.0 - nu);
}

// The exact dot of a block's weights with x (in double), and the magnitude that bounds the float
// computation's error: sum(|scale * code * x| + |offset * x|), the terms the kernel actually adds.
template <class F>
void block_reference(const std::uint8_t* blk, const float* x, double& dot, double& magnitude) {
  std::vector<float> w(F::block_elems);
  decode_block<F>(blk, w.data());
  dot = 0.0;
  magnitude = 0.0;
  for (int p = 0; p < F::pieces; ++p) {
    run8 runs[2];
    F::template load_piece<1>(byte_loader{}, blk, p, runs);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i) {
        const int e = F::run_elem(p, h) + i;
        const double xe = x[e];
        dot += static_cast<double>(w[static_cast<std::size_t>(e)]) * xe;
        const double s = F::affine == 0 ? 1.0 : runs[h].scale;
        magnitude += std::fabs(s * runs[h].code[i] * xe) + (F::affine == 2 ? std::fabs(runs[h].offset * xe) : 0.0);
      }
  }
}

TYPED_TEST(QuantMathFormat, BlockDotIsWithinRoundingOfTheExactDot) {
  using F = TypeParam;
  std::mt19937_64 rng(13);
  const std::size_t blocks = 64;
  std::vector<std::uint8_t> w;
  if constexpr (F::plain) {
    const auto v = normal(rng, blocks * F::block_elems, 1.0f);
    w.resize(blocks * F::block_bytes);
    ASSERT_TRUE(quantize_row(F::type, v.data(), reinterpret_cast<std::byte*>(w.data()), static_cast<std::int64_t>(v.size())));
  } else {
    w = encode(F::type, normal(rng, blocks * F::block_elems, 1.0f));
  }
  const auto x = normal(rng, blocks * F::block_elems, 1.0f);
  // Depth: 8 roundings in a run's chain (or in sum(x)), 2 for the scale and offset, 1 per later run.
  const double g = gamma(8 + 2 + 2 * F::pieces);
  double worst = 0.0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::uint8_t* blk = w.data() + b * F::block_bytes;
    const float* xb = x.data() + b * F::block_elems;
    double dot, magnitude;
    block_reference<F>(blk, xb, dot, magnitude);
    const float got = block_dot<F>(blk, xb);
    const double err = std::fabs(static_cast<double>(got) - dot);
    EXPECT_LE(err, g * magnitude) << "block " << b << ": " << got << " vs " << dot;
    worst = std::max(worst, err / magnitude);
  }
  EXPECT_GT(worst, 0.0);  // the comparison is not vacuous: float rounding is visible
}

// ---- the GEMV, emulated --------------------------------------------------------------------------

// y = x W^T (+ r) the way linear_kernels.cu computes it: per pass of up to gemv_max_m activation
// rows, per CTA of gemv_rows output rows, every thread's gemv_thread, then the warps' shuffle
// butterflies, the warps' sums in order and the residual.
template <class F, int A, int MaxM>
void emulate_pass(const checked_loader& ld, const std::uint8_t* w, std::int64_t N, std::int64_t K, const float* x, int mc,
                  float* y, const float* r) {
  const std::int64_t rb = row_bytes<F>(K);
  std::vector<std::array<std::array<float, MaxM>, gemv_rows>> acc(gemv_threads);
  for (std::int64_t n0 = 0; n0 < N; n0 += gemv_rows) {
    const std::uint8_t* rows[gemv_rows];
    for (int i = 0; i < gemv_rows; ++i) rows[i] = w + (n0 + i < N ? n0 + i : N - 1) * rb;
    for (int t = 0; t < gemv_threads; ++t) {
      float a[gemv_rows][MaxM];
      gemv_thread<F, A, MaxM>(ld, rows, K, x, mc, t, gemv_threads, a);
      for (int i = 0; i < gemv_rows; ++i)
        for (int m = 0; m < MaxM; ++m) acc[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)][static_cast<std::size_t>(m)] = a[i][m];
    }
    for (int i = 0; i < gemv_rows; ++i)
      for (int m = 0; m < mc; ++m) {
        float part[gemv_warps];
        for (int wp = 0; wp < gemv_warps; ++wp) {
          float v[32];
          for (int l = 0; l < 32; ++l) v[l] = acc[static_cast<std::size_t>(32 * wp + l)][static_cast<std::size_t>(i)][static_cast<std::size_t>(m)];
          for (int off = 16; off > 0; off >>= 1) {
            float next[32];
            for (int l = 0; l < 32; ++l) next[l] = v[l] + v[l ^ off];
            std::copy(next, next + 32, v);
          }
          part[wp] = v[0];
        }
        const std::int64_t n = n0 + i;
        if (n >= N) continue;
        float s = part[0];
        for (int wp = 1; wp < gemv_warps; ++wp) s += part[wp];
        if (r != nullptr) s += r[m * N + n];
        y[m * N + n] = s;
      }
  }
}

template <class F>
void emulate_gemv(checked_loader& ld, const std::uint8_t* w, std::int64_t N, std::int64_t K, const float* x, std::int64_t M,
                  float* y, const float* r) {
  const int a = select_align<F>(common_align(addr(w), static_cast<std::uint64_t>(row_bytes<F>(K))));
  ld.xvec = x_vector_ok(addr(x), K);
  for (std::int64_t m0 = 0; m0 < M; m0 += gemv_max_m) {
    const int mc = static_cast<int>(std::min<std::int64_t>(gemv_max_m, M - m0));
    with_align<F>(a, [&](auto al) {
      with_pass_m(gemv_pass_m(mc), [&](auto pm) {
        emulate_pass<F, decltype(al)::value, decltype(pm)::value>(ld, w, N, K, x + m0 * K, mc, y + m0 * N,
                                                                   r != nullptr ? r + m0 * N : nullptr);
      });
    });
  }
}

TYPED_TEST(QuantMathFormat, GemvEmulationIsWithinRoundingOfTheExactProduct) {
  using F = TypeParam;
  std::mt19937_64 rng(14);
  const std::vector<std::int64_t> ks = F::plain ? std::vector<std::int64_t>{1, 15, 16, 33, 300, 2071}
                                                : std::vector<std::int64_t>{F::block_elems, 3 * F::block_elems, 9 * F::block_elems,
                                                                            F::block_elems * (F::block_elems == 32 ? 139 : 17)};
  struct shape {
    std::int64_t N, M;
    std::size_t w_offset, x_offset;  // bytes, floats past a 64-byte boundary
    bool residual;
  };
  const shape shapes[] = {{1, 1, 0, 0, false}, {3, 2, 0, 0, true}, {5, 3, 2, 1, false}, {2, 8, 1, 0, true},
                          {3, 9, 0, 3, true},  {4, 17, 16, 0, false}, {1, 5, 34, 4, true}};
  for (const std::int64_t K : ks)
    for (const shape& s : shapes) {
      const std::size_t wn = static_cast<std::size_t>(s.N * K);
      std::vector<std::uint8_t> wdata(static_cast<std::size_t>(row_bytes<F>(K) * s.N));
      const auto wv = normal(rng, wn, 0.5f);
      ASSERT_TRUE(quantize_row(F::type, wv.data(), reinterpret_cast<std::byte*>(wdata.data()), static_cast<std::int64_t>(wn)));
      placed_bytes w(wdata.size(), s.w_offset);
      std::memcpy(w.data(), wdata.data(), wdata.size());
      const auto wref = reference_decode(F::type, wdata.data(), static_cast<std::int64_t>(wn));
      const auto xv = normal(rng, static_cast<std::size_t>(s.M * K), 1.0f);
      placed_bytes xbuf(xv.size() * 4, 4 * s.x_offset);
      auto* x = reinterpret_cast<float*>(xbuf.data());
      std::memcpy(x, xv.data(), xv.size() * 4);
      const auto r = normal(rng, static_cast<std::size_t>(s.M * s.N), 1.0f);
      std::vector<float> y(static_cast<std::size_t>(s.M * s.N), std::numeric_limits<float>::quiet_NaN());
      checked_loader ld;
      emulate_gemv<F>(ld, w.data(), s.N, K, x, s.M, y.data(), s.residual ? r.data() : nullptr);
      EXPECT_EQ(ld.misaligned, 0) << "K " << K << " N " << s.N;

      // Depth of the roundings any term goes through: 8 in its run (or sum(x)), 2 (scale, offset), one
      // per later accumulation into the thread's sum (two runs per piece, plus the plain formats' tail
      // elements), 5 in the warp butterfly, one per warp, one for the residual.
      const std::int64_t pieces = K / F::block_elems * F::pieces;
      const std::int64_t per_thread = 2 * ((pieces + gemv_threads - 1) / gemv_threads) +
                                      (F::plain ? (K % F::block_elems + gemv_threads - 1) / gemv_threads : 0);
      const double g = gamma(static_cast<int>(8 + 2 + per_thread + 5 + gemv_warps + 1));
      for (std::int64_t m = 0; m < s.M; ++m)
        for (std::int64_t n = 0; n < s.N; ++n) {
          double dot = 0.0, magnitude = 0.0;
          const std::uint8_t* row = wdata.data() + n * row_bytes<F>(K);
          if constexpr (F::plain) {
            for (std::int64_t k = 0; k < K; ++k) {
              const double t = static_cast<double>(wref[static_cast<std::size_t>(n * K + k)]) * xv[static_cast<std::size_t>(m * K + k)];
              dot += t;
              magnitude += std::fabs(t);
            }
          } else {
            for (std::int64_t b = 0; b < K / F::block_elems; ++b) {
              double d, mag;
              block_reference<F>(row + b * F::block_bytes, xv.data() + m * K + b * F::block_elems, d, mag);
              dot += d;
              magnitude += mag;
            }
          }
          if (s.residual) {
            dot += r[static_cast<std::size_t>(m * s.N + n)];
            magnitude += std::fabs(r[static_cast<std::size_t>(m * s.N + n)]);
          }
          const float got = y[static_cast<std::size_t>(m * s.N + n)];
          EXPECT_LE(std::fabs(static_cast<double>(got) - dot), g * magnitude)
              << "K " << K << " N " << s.N << " M " << s.M << " at (" << m << ", " << n << "): " << got << " vs " << dot;
        }
    }
}

}  // namespace
}  // namespace troupe::exec::cuda::quant

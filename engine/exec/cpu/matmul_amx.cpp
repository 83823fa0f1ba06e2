// The AMX products (detail/amx_tiles.hpp) over the hardware's tile instructions. Compiled with the
// avx512 level's flags and AMX's; called only once amx_usable() has held these functions to the
// emulation on this CPU (amx.cpp).
#include <immintrin.h>

#include "engine/exec/cpu/detail/amx_tiles.hpp"

namespace troupe::exec::cpu::detail {
namespace {

// GCC's tile intrinsics paste the tile number into the instruction's text, so each takes a literal:
// every tile a kernel names is spelled out below.
#define TROUPE_TILES(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
// The accumulator, A and B tiles of amx_tiles.hpp's blocks.
#define TROUPE_TILE_PRODUCTS(X) X(0, 4, 6) X(1, 4, 7) X(2, 5, 6) X(3, 5, 7)
template <int C, int A, int B>
inline constexpr bool tile_product = (C == 0 && A == 4 && B == 6) || (C == 1 && A == 4 && B == 7) || (C == 2 && A == 5 && B == 6) ||
                                     (C == 3 && A == 5 && B == 7);

struct amx_hardware {
  static void config(const amx_config& c) { _tile_loadconfig(&c); }
  static void release() { _tile_release(); }
  template <int T>
  static void zero() {
#define TROUPE_ZERO(t) \
  if constexpr (T == t) _tile_zero(t);
    TROUPE_TILES(TROUPE_ZERO)
#undef TROUPE_ZERO
  }
  template <int T>
  static void load(const void* p, std::size_t stride) {
    [[maybe_unused]] const long s = static_cast<long>(stride);
#define TROUPE_LOAD(t) \
  if constexpr (T == t) _tile_loadd(t, p, s);
    TROUPE_TILES(TROUPE_LOAD)
#undef TROUPE_LOAD
  }
  template <int T>
  static void store(void* p, std::size_t stride) {
    [[maybe_unused]] const long s = static_cast<long>(stride);
#define TROUPE_STORE(t) \
  if constexpr (T == t) _tile_stored(t, p, s);
    TROUPE_TILES(TROUPE_STORE)
#undef TROUPE_STORE
  }
  template <bool Bf16, int C, int A, int B>
  static void dp() {
    static_assert(tile_product<C, A, B>);
#define TROUPE_DP(c, a, b)                          \
  if constexpr (C == c && A == a && B == b) {       \
    if constexpr (Bf16) _tile_dpbf16ps(c, a, b);    \
    else _tile_dpbssd(c, a, b);                     \
  }
    TROUPE_TILE_PRODUCTS(TROUPE_DP)
#undef TROUPE_DP
  }
  template <int C, int A, int B>
  static void dp_bf16() {
    dp<true, C, A, B>();
  }
  template <int C, int A, int B>
  static void dp_s8() {
    dp<false, C, A, B>();
  }
  static void f16x16(const std::byte* p, float* out) {
    // The zero-masked form: GCC 12 calls the plain one's undefined source maybe-uninitialized.
    _mm512_storeu_ps(out, _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
};

}  // namespace

void amx_bf16_rows_hardware(const gemm_args& a) { amx_bf16_rows<amx_hardware>(a); }
void amx_q8_0_rows_hardware(const gemm_args& a) { amx_q8_0_rows<amx_hardware>(a); }

}  // namespace troupe::exec::cpu::detail

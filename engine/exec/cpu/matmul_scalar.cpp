// The portable kernels: the packed layouts walked one element at a time. They fix what every
// vectorized level must compute, including the integer arithmetic of the quantized formats, whose
// activations are rounded to int8 per block exactly as the vector levels round them.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/half.hpp"
#include "engine/exec/cpu/matmul_detail.hpp"

namespace troupe::exec::cpu::detail {
namespace {

float f16_at(const std::byte* p, std::int64_t i) {
  std::uint16_t v;
  std::memcpy(&v, p + 2 * i, 2);
  return f16_to_f32(v);
}

std::uint8_t u8_at(const std::byte* p, std::size_t i) { return std::to_integer<std::uint8_t>(p[i]); }

// Rounds to nearest, ties to even, as the vector conversions do; NaN (from a non-finite row) becomes 0.
int round_i8(float v) {
  if (!(v == v)) return 0;
  return static_cast<int>(std::nearbyint(std::clamp(v, -127.0f, 127.0f)));
}

// Symmetric int8 quantization of `n` values against their largest magnitude; returns the scale.
float quantize_block(const float* x, int n, std::int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = static_cast<std::int8_t>(round_i8(x[i] * id));
  return amax / 127.0f;
}

template <int Offset>
void prepare_q8_32(const float* x, std::int64_t k, std::byte* out) {
  auto* q = reinterpret_cast<std::int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + act32_d(k));
  auto* s = reinterpret_cast<std::int32_t*>(out + act32_s(k));
  for (std::int64_t b = 0; b < k / 32; ++b) {
    d[b] = quantize_block(x + 32 * b, 32, q + 32 * b);
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += q[32 * b + i];
    s[b] = Offset * sum;
  }
}

void prepare_q8_256(const float* x, std::int64_t k, std::byte* out, int group, int offset) {
  auto* q = reinterpret_cast<std::int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + act256_d(k));
  auto* s = reinterpret_cast<std::int32_t*>(out + act256_s(k));
  auto* hl = reinterpret_cast<std::int8_t*>(out + act256_hl(k));
  for (std::int64_t b = 0; b < k / 256; ++b) d[b] = quantize_block(x + 256 * b, 256, q + 256 * b);
  for (std::int64_t g = 0; g < k / group; ++g) {
    int sum = 0;
    for (int i = 0; i < group; ++i) sum += q[group * g + i];
    s[g] = offset * sum;
    if (group == 32) {
      // sum = 128 h + l with l in [0, 127]: both halves fit an int8 for |sum| <= 32 * 127.
      const int h = (sum >= 0 ? sum : sum - 127) / 128;
      hl[(g / 8) * 16 + g % 8] = static_cast<std::int8_t>(h);
      hl[(g / 8) * 16 + 8 + g % 8] = static_cast<std::int8_t>(sum - 128 * h);
    }
  }
}

void prepare_q4_k(const float* x, std::int64_t k, std::byte* out) { prepare_q8_256(x, k, out, 32, 1); }
void prepare_q6_k(const float* x, std::int64_t k, std::byte* out) { prepare_q8_256(x, k, out, 16, 32); }
void prepare_q3_k(const float* x, std::int64_t k, std::byte* out) { prepare_q8_256(x, k, out, 16, 4); }
void prepare_q2_k(const float* x, std::int64_t k, std::byte* out) { prepare_q8_256(x, k, out, 16, 1); }
std::size_t bytes32(std::int64_t k) { return act32_bytes(k); }
std::size_t bytes256(std::int64_t k) { return act256_bytes(k); }

// Writes the valid rows of a panel's 16 accumulators.
void store(const gemm_args& a, std::int64_t m, std::int64_t p, const float* acc) {
  const std::int64_t n0 = p * panel_rows;
  const std::int64_t rows = std::min<std::int64_t>(panel_rows, a.w->rows - n0);
  float* y = a.y + m * a.ldy + n0;
  if (a.r) {
    const float* r = a.r + m * a.ldr + n0;
    for (std::int64_t j = 0; j < rows; ++j) y[j] = acc[j] + r[j];
    return;
  }
  std::copy(acc, acc + rows, y);
}

const float* x_row(const gemm_args& a, std::int64_t m) {
  return reinterpret_cast<const float*>(a.acts + static_cast<std::size_t>(m) * a.act_stride);
}

void compute_f32(const gemm_args& a) {
  const std::int64_t k = a.w->cols;
  for (std::int64_t p = a.p0; p < a.p1; ++p) {
    const auto* w = reinterpret_cast<const float*>(a.w->panel(p));
    for (std::int64_t m = a.m0; m < a.m1; ++m) {
      const float* x = x_row(a, m);
      float acc[panel_rows] = {};
      for (std::int64_t c = 0; c < k; ++c) {
        for (int r = 0; r < panel_rows; ++r) acc[r] += w[c * panel_rows + r] * x[c];
      }
      store(a, m, p, acc);
    }
  }
}

void compute_f16(const gemm_args& a) {
  const std::int64_t k = a.w->cols;
  for (std::int64_t p = a.p0; p < a.p1; ++p) {
    const std::byte* w = a.w->panel(p);
    for (std::int64_t m = a.m0; m < a.m1; ++m) {
      const float* x = x_row(a, m);
      float acc[panel_rows] = {};
      for (std::int64_t c = 0; c < k; ++c) {
        for (int r = 0; r < panel_rows; ++r) acc[r] += f16_at(w, c * panel_rows + r) * x[c];
      }
      store(a, m, p, acc);
    }
  }
}

void compute_bf16(const gemm_args& a) {
  const std::int64_t k = a.w->cols;
  for (std::int64_t p = a.p0; p < a.p1; ++p) {
    const std::byte* w = a.w->panel(p);
    for (std::int64_t m = a.m0; m < a.m1; ++m) {
      const float* x = x_row(a, m);
      float acc[panel_rows] = {};
      for (std::int64_t c = 0; c < k; ++c) {
        for (int r = 0; r < panel_rows; ++r) {
          std::uint16_t v;
          std::memcpy(&v, w + 2 * ((c / 2) * panel_rows * 2 + r * 2 + c % 2), 2);
          acc[r] += bf16_to_f32(v) * x[c];
        }
      }
      store(a, m, p, acc);
    }
  }
}

struct act_row {
  const std::int8_t* q;
  const float* d;
  const std::int32_t* s;
  const std::int8_t* hl;
};

act_row acts32(const gemm_args& a, std::int64_t m) {
  const std::byte* r = a.acts + static_cast<std::size_t>(m) * a.act_stride;
  const std::int64_t k = a.w->cols;
  return {reinterpret_cast<const std::int8_t*>(r), reinterpret_cast<const float*>(r + act32_d(k)),
          reinterpret_cast<const std::int32_t*>(r + act32_s(k)), nullptr};
}

act_row acts256(const gemm_args& a, std::int64_t m) {
  const std::byte* r = a.acts + static_cast<std::size_t>(m) * a.act_stride;
  const std::int64_t k = a.w->cols;
  return {reinterpret_cast<const std::int8_t*>(r), reinterpret_cast<const float*>(r + act256_d(k)),
          reinterpret_cast<const std::int32_t*>(r + act256_s(k)), reinterpret_cast<const std::int8_t*>(r + act256_hl(k))};
}

// Walks the task's panels and rows over the 32-blocks of a format with int8 activations: acc[r] gains
// block(panel, b, x, r), row r's f32 contribution of block b.
template <class Block>
void walk32(const gemm_args& a, Block&& block) {
  const std::int64_t blocks = a.w->cols / 32;
  for (std::int64_t p = a.p0; p < a.p1; ++p) {
    const std::byte* panel = a.w->panel(p);
    for (std::int64_t m = a.m0; m < a.m1; ++m) {
      const act_row x = acts32(a, m);
      float acc[panel_rows] = {};
      for (std::int64_t b = 0; b < blocks; ++b)
        for (int r = 0; r < panel_rows; ++r) acc[r] += block(panel, b, x, r);
      store(a, m, p, acc);
    }
  }
}

// Row r's dot of a 32-block of nibbles (q4_0's code layout at u) against xq, each code through `level`.
template <class Level>
int nibble_dot(const std::byte* u, int r, const std::int8_t* xq, Level level) {
  int dot = 0;
  for (int g = 0; g < 4; ++g)
    for (int t = 0; t < 4; ++t) {
      const int v = u8_at(u, (g * panel_rows + r) * 4 + t);
      dot += level(v & 15) * xq[4 * g + t] + level(v >> 4) * xq[16 + 4 * g + t];
    }
  return dot;
}

// Row r's dot of a 32-block of signed bytes (q8_0's code layout at u) against xq.
int byte_dot(const std::byte* u, int r, const std::int8_t* xq) {
  int dot = 0;
  for (int g = 0; g < 8; ++g)
    for (int t = 0; t < 4; ++t) dot += static_cast<std::int8_t>(u8_at(u, (g * panel_rows + r) * 4 + t)) * xq[4 * g + t];
  return dot;
}

constexpr auto as_is = [](int v) { return v; };

void compute_q8_0(const gemm_args& a) {
  walk32(a, [](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    const int dot = byte_dot(panel + block_codes(b, q8_0_unit), r, x.q + 32 * b);
    return f16_at(panel + block_scales(b, q8_0_unit), r) * x.d[b] * static_cast<float>(dot);
  });
}

void compute_q4_0(const gemm_args& a) {
  walk32(a, [](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    const int dot = nibble_dot(panel + block_codes(b, q4_0_unit), r, x.q + 32 * b, as_is);
    // s holds 8 times the block's sum: the nibbles are stored biased by 8.
    return f16_at(panel + block_scales(b, q4_0_unit), r) * x.d[b] * static_cast<float>(dot - x.s[b]);
  });
}

// MXFP4: q4_0's walk with the E2M1 codes (doubled, as ggml keeps them) read through a table and each
// block's scale 2^(e - 128) (the doubling undone); the activations' sums are not used.
void compute_mxfp4(const gemm_args& a) {
  static constexpr int e2m1_doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  walk32(a, [](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    const int dot = nibble_dot(panel + block_codes(b, q4_0_unit), r, x.q + 32 * b, [](int v) { return e2m1_doubled[v]; });
    const auto d = static_cast<float>(std::ldexp(1.0, static_cast<int>(u8_at(panel + block_scales(b, q4_0_unit), static_cast<std::size_t>(r))) - 128));
    return d * x.d[b] * static_cast<float>(dot);
  });
}

// q4_a32: unsigned nibbles, each row's zero point times the activations' plain sum (s) taken back.
void compute_q4_a32(const gemm_args& a) {
  const int shift = a.w->group_shift;
  walk32(a, [shift](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    constexpr auto L = q4_a32_groups;
    const std::size_t head = L.head(b, shift);
    const int dot = nibble_dot(panel + L.codes(b, shift), r, x.q + 32 * b, as_is);
    const int z = u8_at(panel, head + L.zeros_at + static_cast<std::size_t>(r));
    return f16_at(panel + head, r) * x.d[b] * static_cast<float>(dot - z * x.s[b]);
  });
}

// Row r's dot of a q5 block (q4_0's codes at u, the fifth bits after them) against xq: unsigned 5-bit codes.
int q5_dot(const std::byte* u, int r, const std::int8_t* xq) {
  std::uint32_t word;
  std::memcpy(&word, u + q4_0_unit + 4 * r, 4);
  int dot = 0;
  for (int g = 0; g < 4; ++g)
    for (int t = 0; t < 4; ++t) {
      const int v = u8_at(u, (g * panel_rows + r) * 4 + t);
      const int lo = (v & 15) | static_cast<int>((word >> (8 * t + g)) & 1u) << 4;
      const int hi = (v >> 4) | static_cast<int>((word >> (8 * t + 4 + g)) & 1u) << 4;
      dot += lo * xq[4 * g + t] + hi * xq[16 + 4 * g + t];
    }
  return dot;
}

// q4_1 / q5_1: d * q + m per weight, so d x.d dot + m x.d (the activations' plain sum, s).
template <bool Fifth>
void compute_min32(const gemm_args& a) {
  walk32(a, [](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    constexpr auto L = Fifth ? q5_1_pairs : q4_1_pairs;
    const std::byte* u = panel + L.codes(b);
    const int dot = Fifth ? q5_dot(u, r, x.q + 32 * b) : nibble_dot(u, r, x.q + 32 * b, as_is);
    return f16_at(panel + L.scales(b), r) * x.d[b] * static_cast<float>(dot) +
           f16_at(panel + L.zeros(b), r) * (x.d[b] * static_cast<float>(x.s[b]));
  });
}

// q5_0: unsigned 5-bit codes, 16 times the activations' sum (s) taken back.
void compute_q5_0(const gemm_args& a) {
  walk32(a, [](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    constexpr auto L = q5_0_pairs;
    const int dot = q5_dot(panel + L.codes(b), r, x.q + 32 * b);
    return f16_at(panel + L.scales(b), r) * x.d[b] * static_cast<float>(dot - x.s[b]);
  });
}

// IQ4_NL and IQ4_XS: the codes through IQ4_NL's table of levels; q4_0's layout (f16 scales) or
// iq4_xs_layout's superblocks (d times each block's int8 scale).
template <bool Xs>
void compute_iq4(const gemm_args& a) {
  static constexpr int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  walk32(a, [](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    const std::byte* u = panel + (Xs ? iq4_xs_blocks.codes(b) : block_codes(b, q4_0_unit));
    const int dot = nibble_dot(u, r, x.q + 32 * b, [](int v) { return levels[v]; });
    float d;
    if constexpr (Xs) {
      std::memcpy(&d, panel + iq4_xs_blocks.d(b) + 4 * r, 4);
      d *= static_cast<float>(static_cast<std::int8_t>(u8_at(panel, iq4_xs_blocks.scales(b) + static_cast<std::size_t>(r))));
    } else {
      d = f16_at(panel + block_scales(b, q4_0_unit), r);
    }
    return d * x.d[b] * static_cast<float>(dot);
  });
}

// q8_a32: the codes and zero points are stored less 128; (q - 128) . x - (z - 128) sum(x).
void compute_q8_a32(const gemm_args& a) {
  const int shift = a.w->group_shift;
  walk32(a, [shift](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    constexpr auto L = q8_a32_groups;
    const std::size_t head = L.head(b, shift);
    const int dot = byte_dot(panel + L.codes(b, shift), r, x.q + 32 * b);
    const int z = static_cast<std::int8_t>(u8_at(panel, head + L.zeros_at + static_cast<std::size_t>(r)));
    float d;
    std::memcpy(&d, panel + head + 4 * r, 4);
    return d * x.d[b] * static_cast<float>(dot - z * x.s[b]);
  });
}

// fp8_s32: f32 activations against s x e4m3(code), each weight rounded once.
void compute_fp8_s32(const gemm_args& a) {
  const std::int64_t blocks = a.w->cols / 32;
  for (std::int64_t p = a.p0; p < a.p1; ++p) {
    const std::byte* panel = a.w->panel(p);
    for (std::int64_t m = a.m0; m < a.m1; ++m) {
      const float* x = x_row(a, m);
      float acc[panel_rows] = {};
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::byte* u = panel + static_cast<std::size_t>(b) * fp8_s32_unit;
        for (int r = 0; r < panel_rows; ++r) {
          float s;
          std::memcpy(&s, u + 4 * r, 4);
          for (int j = 0; j < 32; ++j) acc[r] += s * fp8_e4m3_to_f32(u8_at(u, static_cast<std::size_t>(64 + j * panel_rows + r))) * x[32 * b + j];
        }
      }
      store(a, m, p, acc);
    }
  }
}

// q4_k, and q5_k with each code's fifth bit from its word layout (matmul_detail.hpp).
// Walks the task's panels and rows over the 256-superblocks of a k-quant: acc[r] gains
// block(panel, b, x, r), row r's f32 contribution of superblock b (the panel's blocks and any leading
// scale run are the block's to find).
template <class Block>
void walk256(const gemm_args& a, Block&& block) {
  const std::int64_t blocks = a.w->cols / 256;
  for (std::int64_t p = a.p0; p < a.p1; ++p) {
    const std::byte* panel = a.w->panel(p);
    for (std::int64_t m = a.m0; m < a.m1; ++m) {
      const act_row x = acts256(a, m);
      float acc[panel_rows] = {};
      for (std::int64_t b = 0; b < blocks; ++b)
        for (int r = 0; r < panel_rows; ++r) acc[r] += block(panel, b, x, r);
      store(a, m, p, acc);
    }
  }
}

template <bool Five>
void compute_q45_k(const gemm_args& a) {
  walk256(a, [](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    const std::byte* u = panel + b * (Five ? q5_k_unit : q4_k_unit);
    const std::int8_t* xq = x.q + 256 * b;
    int isum = 0, msum = 0;
    for (int sub = 0; sub < 8; ++sub) {
      const int c = sub / 2;
      const int shift = 4 * (sub % 2);
      int dot = 0;
      for (int l = 0; l < 32; ++l) {
        int v = (u8_at(u, q4_k_q + ((c * 8 + l / 4) * panel_rows + r) * 4 + l % 4) >> shift) & 15;
        if constexpr (Five) {
          const int g = l / 4, bit = g % 4 + 4 * (sub % 2);
          v |= ((u8_at(u, q5_k_h + ((c * 2 + g / 4) * panel_rows + r) * 4 + l % 4) >> bit) & 1) << 4;
        }
        dot += v * xq[32 * sub + l];
      }
      isum += u8_at(u, q4_k_scale + sub * panel_rows + r) * dot;
      msum += u8_at(u, q4_k_min + ((sub / 4) * panel_rows + r) * 4 + sub % 4) * x.s[8 * b + sub];
    }
    return x.d[b] * (f16_at(u, r) * static_cast<float>(isum) - f16_at(u + q4_k_dmin, r) * static_cast<float>(msum));
  });
}

void compute_q6_k(const gemm_args& a) {
  const std::int64_t blocks = a.w->cols / 256;
  walk256(a, [blocks](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    const std::byte* u = panel + scale_run(blocks) + b * q6_k_unit;
    const std::int8_t* xq = x.q + 256 * b;
    int isum = 0;
    for (int sub = 0; sub < 16; ++sub) {
      int dot = 0;
      for (int i = 0; i < 16; ++i) {
        const int e = 16 * sub + i;
        const int h = e / 128, e1 = e % 128;
        const int lo_byte = e1 % 64, hi_byte = e1 % 32;
        const int lo = (u8_at(u, ((h * 16 + lo_byte / 4) * panel_rows + r) * 4 + lo_byte % 4) >> (4 * (e1 / 64))) & 15;
        const int hi = (u8_at(u, q6_k_qh + ((h * 8 + hi_byte / 4) * panel_rows + r) * 4 + hi_byte % 4) >> (2 * (e1 / 32))) & 3;
        dot += ((lo | (hi << 4)) - 32) * xq[e];
      }
      isum += static_cast<std::int8_t>(u8_at(u, q6_k_scale + sub * panel_rows + r)) * dot;
    }
    return x.d[b] * f16_at(panel, b * panel_rows + r) * static_cast<float>(isum);
  });
}

// q3_k: 3-bit codes (low two bits from ql, the third from hm) biased by 4, signed scales per 16. q2_k
// (Two): the 2-bit codes alone, unsigned scales, less dmin min times the 16-group's plain sum (s).
template <bool Two>
void compute_q23_k(const gemm_args& a) {
  const std::int64_t blocks = a.w->cols / 256;
  walk256(a, [blocks](const std::byte* panel, std::int64_t b, const act_row& x, int r) {
    const std::byte* u = panel + scale_run(blocks) + b * (Two ? q2_k_unit : q3_k_unit);
    const std::int8_t* xq = x.q + 256 * b;
    int isum = 0, msum = 0;
    for (int sub = 0; sub < 16; ++sub) {
      int dot = 0;
      for (int i = 0; i < 16; ++i) {
        const int e = 16 * sub + i;
        const int n = e / 128, jj = (e % 128) / 32, l = e % 32;
        const int lo = (u8_at(u, ((n * 8 + l / 4) * panel_rows + r) * 4 + l % 4) >> (2 * jj)) & 3;
        if constexpr (Two) {
          dot += lo * xq[e];
        } else {
          const int hb = (u8_at(u, q3_k_hm + ((l / 4) * panel_rows + r) * 4 + l % 4) >> (4 * n + jj)) & 1;
          dot += ((lo | (hb << 2)) - 4) * xq[e];
        }
      }
      if constexpr (Two) {
        const int sm = u8_at(u, q2_k_scale + sub * panel_rows + r);
        isum += (sm & 0x0f) * dot;
        msum += (sm >> 4) * x.s[16 * b + sub];
      } else {
        isum += static_cast<std::int8_t>(u8_at(u, q3_k_scale + sub * panel_rows + r)) * dot;
      }
    }
    const float dw = f16_at(panel, b * panel_rows + r);
    return Two ? x.d[b] * (dw * static_cast<float>(isum) - f16_at(u + q2_k_dmin, r) * static_cast<float>(msum))
               : x.d[b] * dw * static_cast<float>(isum);
  });
}

}  // namespace

const kernel_table& scalar_kernels() {
  static const kernel_table t{
      .f32 = {nullptr, nullptr, compute_f32},
      .f16 = {nullptr, nullptr, compute_f16},
      .bf16 = {nullptr, nullptr, compute_bf16},
      .q8_0 = {bytes32, prepare_q8_32<0>, compute_q8_0},
      .q4_0 = {bytes32, prepare_q8_32<8>, compute_q4_0},
      .q4_k = {bytes256, prepare_q4_k, compute_q45_k<false>},
      .q6_k = {bytes256, prepare_q6_k, compute_q6_k},
      .mxfp4 = {bytes32, prepare_q8_32<0>, compute_mxfp4},
      .iq4_nl = {bytes32, prepare_q8_32<0>, compute_iq4<false>},
      .iq4_xs = {bytes32, prepare_q8_32<0>, compute_iq4<true>},
      .q4_a32 = {bytes32, prepare_q8_32<1>, compute_q4_a32},
      .q8_a32 = {bytes32, prepare_q8_32<1>, compute_q8_a32},
      .fp8_s32 = {nullptr, nullptr, compute_fp8_s32},
      .q4_1 = {bytes32, prepare_q8_32<1>, compute_min32<false>},
      .q5_0 = {bytes32, prepare_q8_32<16>, compute_q5_0},
      .q5_1 = {bytes32, prepare_q8_32<1>, compute_min32<true>},
      .q5_k = {bytes256, prepare_q4_k, compute_q45_k<true>},
      .q3_k = {bytes256, prepare_q3_k, compute_q23_k<false>},
      .q2_k = {bytes256, prepare_q2_k, compute_q23_k<true>},
  };
  return t;
}

}  // namespace troupe::exec::cpu::detail

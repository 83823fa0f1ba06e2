#include "engine/exec/cpu/matmul.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <stdlib.h>
#include <sys/mman.h>

#include "engine/core/half.hpp"
#include "engine/core/quant.hpp"
#include "engine/exec/cpu/matmul_detail.hpp"

namespace troupe::exec::cpu {
namespace detail {

aligned_bytes allocate_aligned(std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(64, round64(bytes));
  void* p = nullptr;
  if (posix_memalign(&p, 64, n) != 0) throw std::bad_alloc();
  std::memset(p, 0, n);
  return aligned_bytes(static_cast<std::byte*>(p));
}

// Decode streams every weight once per token, and with 4 KiB pages that is a TLB miss every 4 KiB
// and a hardware prefetcher that stops at each page boundary (a read loop measured 15-20% slower
// than on 2 MiB pages). Packed weights therefore ask for transparent huge pages, which the kernel may
// grant only on request: a matrix of a huge page or more gets its own (its partial last huge page
// stays small, so nothing is wasted), and smaller ones are carved out of shared slabs. A slab is freed
// when its last matrix is, unless it is still the one being carved.
constexpr std::size_t huge_page = std::size_t{2} << 20;
constexpr std::size_t slab_bytes = std::size_t{16} << 20;

struct weight_slab {
  std::byte* base = nullptr;
  std::size_t used = 0;
  int live = 0;
};

class weight_arena {
 public:
  std::pair<std::byte*, weight_slab*> take(std::size_t n) {
    std::lock_guard lk(m_);
    if (!current_ || current_->used + n > slab_bytes) {
      trim(current_);
      retire(current_);
      void* p = nullptr;
      if (posix_memalign(&p, huge_page, slab_bytes) != 0) throw std::bad_alloc();
      (void)madvise(p, slab_bytes, MADV_HUGEPAGE);
      current_ = new weight_slab{static_cast<std::byte*>(p), 0, 0};
    }
    std::byte* p = current_->base + current_->used;
    current_->used += n;
    ++current_->live;
    return {p, current_};
  }

  void trim_current() {
    std::lock_guard lk(m_);
    trim(current_);
  }

  void give_back(weight_slab* s) {
    std::lock_guard lk(m_);
    if (--s->live == 0 && s != current_) release(s);
  }

 private:
  void retire(weight_slab* s) {
    if (s && s->live == 0) release(s);
  }
  // A slab no longer carved: the huge page its last matrix ends in was faulted in whole, the unused
  // rest of it included (up to 2 MiB a slab, 5-10 MB of a small model's resident set); hand the pages
  // past the last matrix back.
  static void trim(weight_slab* s) {
    if (!s || s->live == 0) return;
    const std::size_t page = 4096, from = (s->used + page - 1) / page * page;
    if (from < slab_bytes) (void)madvise(s->base + from, slab_bytes - from, MADV_DONTNEED);
  }
  static void release(weight_slab* s) {
    std::free(s->base);
    delete s;
  }
  std::mutex m_;
  weight_slab* current_ = nullptr;
};

// Never destroyed: packed matrices may outlive any static.
weight_arena& arena() {
  static auto* a = new weight_arena;
  return *a;
}

void free_aligned::operator()(std::byte* p) const {
  if (slab) {
    arena().give_back(slab);
  } else {
    std::free(p);
  }
}

void trim_weight_slabs() { arena().trim_current(); }

aligned_bytes allocate_weights(std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(64, round64(bytes));
  if (n < huge_page) {
    const auto [p, slab] = arena().take(n);
    std::memset(p, 0, n);
    return aligned_bytes(p, free_aligned{slab});
  }
  void* p = nullptr;
  if (posix_memalign(&p, huge_page, n) != 0) throw std::bad_alloc();
  (void)madvise(p, n / huge_page * huge_page, MADV_HUGEPAGE);
  std::memset(p, 0, n);
  return aligned_bytes(static_cast<std::byte*>(p));
}

}  // namespace detail

namespace {

using detail::panel_rows;

// The rows of one panel of the stored matrix: row r of the panel, or null past the last row.
struct source_panel {
  const std::byte* base;
  std::size_t row_bytes;
  std::int64_t first, rows;
  const std::byte* row(int r) const {
    const std::int64_t n = first + r;
    return n < rows ? base + static_cast<std::size_t>(n) * row_bytes : nullptr;
  }
};

void pack_f32(const source_panel& s, std::int64_t k, std::byte* dst) {
  for (int r = 0; r < panel_rows; ++r) {
    const std::byte* src = s.row(r);
    if (!src) continue;
    for (std::int64_t c = 0; c < k; ++c) std::memcpy(dst + (c * panel_rows + r) * 4, src + c * 4, 4);
  }
}

void pack_f16(const source_panel& s, std::int64_t k, std::byte* dst) {
  for (int r = 0; r < panel_rows; ++r) {
    const std::byte* src = s.row(r);
    if (!src) continue;
    for (std::int64_t c = 0; c < k; ++c) std::memcpy(dst + (c * panel_rows + r) * 2, src + c * 2, 2);
  }
}

void pack_bf16(const source_panel& s, std::int64_t k, std::byte* dst) {
  for (int r = 0; r < panel_rows; ++r) {
    const std::byte* src = s.row(r);
    if (!src) continue;
    for (std::int64_t c = 0; c < k; ++c) {
      std::memcpy(dst + ((c / 2) * panel_rows * 2 + r * 2 + c % 2) * 2, src + c * 2, 2);
    }
  }
}

// Calls fn(r, b, block) for each of the panel's present rows r and its `blocks` stored blocks of
// `block_bytes` bytes each.
template <class Fn>
void each_block(const source_panel& s, std::int64_t blocks, std::size_t block_bytes, Fn&& fn) {
  for (int r = 0; r < panel_rows; ++r) {
    const std::byte* src = s.row(r);
    if (!src) continue;
    for (std::int64_t b = 0; b < blocks; ++b) fn(r, b, src + b * block_bytes);
  }
}

// Nibbles of one 32-block (16 bytes, q4_0's order) into q4_0's code layout at `q`, row r.
void put_nibbles(std::byte* q, int r, const std::byte* nibbles) {
  for (int g = 0; g < 4; ++g) std::memcpy(q + (g * panel_rows + r) * 4, nibbles + 4 * g, 4);
}

// q8_0 block: f16 d, 32 i8. q4_0 block: f16 d, 16 bytes of nibbles.
template <std::size_t Unit, int Groups>
void pack_q32(const source_panel& s, std::int64_t k, std::byte* dst) {
  constexpr std::size_t block_bytes = 2 + 4 * Groups;
  each_block(s, k / 32, block_bytes, [&](int r, std::int64_t b, const std::byte* blk) {
    std::memcpy(dst + detail::block_scales(b, Unit) + r * 2, blk, 2);
    std::byte* q = dst + detail::block_codes(b, Unit);
    for (int g = 0; g < Groups; ++g) std::memcpy(q + (g * panel_rows + r) * 4, blk + 2 + 4 * g, 4);
  });
}

// MXFP4 block: one E8M0 exponent byte, 16 bytes of E2M1 nibbles in q4_0's order.
void pack_mxfp4(const source_panel& s, std::int64_t k, std::byte* dst) {
  each_block(s, k / 32, 17, [&](int r, std::int64_t b, const std::byte* blk) {
    dst[detail::block_scales(b, detail::q4_0_unit) + r] = blk[0];
    put_nibbles(dst + detail::block_codes(b, detail::q4_0_unit), r, blk + 1);
  });
}

// IQ4_XS superblock: f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of nibbles (eight 32-blocks in
// q4_0's order each); d as f32 and each block's 6-bit scale less 32 as int8 (iq4_xs_layout).
void pack_iq4_xs(const source_panel& s, std::int64_t k, std::byte* dst) {
  constexpr auto L = detail::iq4_xs_blocks;
  each_block(s, k / 256, 136, [&](int r, std::int64_t sb, const std::byte* blk) {
    std::uint16_t dbits, sh;
    std::memcpy(&dbits, blk, 2);
    std::memcpy(&sh, blk + 2, 2);
    const float d = f16_to_f32(dbits);
    std::memcpy(dst + L.d(8 * sb) + r * 4, &d, 4);
    for (int ib = 0; ib < 8; ++ib) {
      const std::int64_t b = 8 * sb + ib;
      const int sl = static_cast<int>(std::to_integer<std::uint8_t>(blk[4 + ib / 2]));
      const int ls = ((sl >> (4 * (ib % 2))) & 0x0f) | (((sh >> (2 * ib)) & 3) << 4);
      dst[L.scales(b) + r] = std::byte{static_cast<std::uint8_t>(static_cast<std::int8_t>(ls - 32))};
      put_nibbles(dst + L.codes(b), r, blk + 8 + 16 * ib);
    }
  });
}

// q4_a32 block: f16 d, u8 z, a zero byte, 16 bytes of nibbles. A group's header takes its first
// block's d and z (every block of the group has the same ones: uniform_group_shift).
void pack_q4_a32(const source_panel& s, std::int64_t k, int shift, std::byte* dst) {
  constexpr auto L = detail::q4_a32_groups;
  each_block(s, k / 32, 20, [&](int r, std::int64_t b, const std::byte* blk) {
    const std::size_t head = L.head(b, shift);
    std::memcpy(dst + head + r * 2, blk, 2);
    dst[head + L.zeros_at + r] = blk[2];
    put_nibbles(dst + L.codes(b, shift), r, blk + 4);
  });
}

// q4_1 block: f16 d, f16 m, 16 bytes of nibbles. q5_0: f16 d, u32 qh, 16 bytes of nibbles. q5_1: f16 d,
// f16 m, u32 qh, 16 bytes. The fifth bits go to q5's word layout (matmul_detail.hpp).
template <bool Min, bool Fifth>
void pack_q4_1_q5(const source_panel& s, std::int64_t k, std::byte* dst) {
  constexpr auto L = Fifth ? (Min ? detail::q5_1_pairs : detail::q5_0_pairs) : detail::q4_1_pairs;
  constexpr std::size_t block_bytes = 2 + (Min ? 2 : 0) + (Fifth ? 4 : 0) + 16;
  each_block(s, k / 32, block_bytes, [&](int r, std::int64_t b, const std::byte* blk) {
    std::memcpy(dst + L.scales(b) + r * 2, blk, 2);
    if constexpr (Min) std::memcpy(dst + L.zeros(b) + r * 2, blk + 2, 2);
    const std::byte* codes = blk + block_bytes - 16;
    put_nibbles(dst + L.codes(b), r, codes);
    if constexpr (Fifth) {
      std::uint32_t qh, word = 0;
      std::memcpy(&qh, codes - 4, 4);
      for (int g = 0; g < 4; ++g)
        for (int t = 0; t < 4; ++t) {
          word |= ((qh >> (4 * g + t)) & 1u) << (8 * t + g);
          word |= ((qh >> (16 + 4 * g + t)) & 1u) << (8 * t + 4 + g);
        }
      std::memcpy(dst + L.codes(b) + detail::q4_0_unit + r * 4, &word, 4);
    }
  });
}

// q8_a32 block: f32 d, u8 z, three zero bytes, 32 u8 codes; kept signed (less 128), as q8_0's codes.
void pack_q8_a32(const source_panel& s, std::int64_t k, int shift, std::byte* dst) {
  constexpr auto L = detail::q8_a32_groups;
  each_block(s, k / 32, 40, [&](int r, std::int64_t b, const std::byte* blk) {
    const std::size_t head = L.head(b, shift);
    std::memcpy(dst + head + r * 4, blk, 4);
    dst[head + L.zeros_at + r] = blk[4] ^ std::byte{0x80};
    std::byte* q = dst + L.codes(b, shift);
    for (int g = 0; g < 8; ++g)
      for (int t = 0; t < 4; ++t) q[(g * panel_rows + r) * 4 + t] = blk[8 + 4 * g + t] ^ std::byte{0x80};
  });
}

// fp8_s32 block: f32 s, 32 E4M3 codes.
void pack_fp8_s32(const source_panel& s, std::int64_t k, std::byte* dst) {
  each_block(s, k / 32, 36, [&](int r, std::int64_t b, const std::byte* blk) {
    std::byte* u = dst + static_cast<std::size_t>(b) * detail::fp8_s32_unit;
    std::memcpy(u + r * 4, blk, 4);
    for (int j = 0; j < 32; ++j) u[64 + j * panel_rows + r] = blk[4 + j];
  });
}

// q4_k superblock: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles. q5_k: the
// same with 32 bytes of fifth bits (bit s of qh[l] for element l of sub-block s) before the nibbles.
template <bool Five>
void pack_q45_k(const source_panel& s, std::int64_t k, std::byte* dst) {
  constexpr std::size_t block_bytes = Five ? 176 : 144, unit = Five ? detail::q5_k_unit : detail::q4_k_unit;
  constexpr std::size_t qs_at = Five ? 48 : 16;
  each_block(s, k / 256, block_bytes, [&](int r, std::int64_t b, const std::byte* blk) {
    std::byte* u = dst + b * unit;
    std::memcpy(u + r * 2, blk, 2);
    std::memcpy(u + detail::q4_k_dmin + r * 2, blk + 2, 2);
    std::uint8_t sm[12];
    std::memcpy(sm, blk + 4, 12);
    for (int j = 0; j < 8; ++j) {
      std::uint8_t sc, mn;
      if (j < 4) {
        sc = sm[j] & 63;
        mn = sm[j + 4] & 63;
      } else {
        sc = static_cast<std::uint8_t>((sm[j + 4] & 0x0f) | ((sm[j - 4] >> 6) << 4));
        mn = static_cast<std::uint8_t>((sm[j + 4] >> 4) | ((sm[j] >> 6) << 4));
      }
      u[detail::q4_k_scale + j * panel_rows + r] = std::byte{sc};
      u[detail::q4_k_min + ((j / 4) * panel_rows + r) * 4 + j % 4] = std::byte{mn};
    }
    for (int c = 0; c < 4; ++c) {
      for (int g = 0; g < 8; ++g) {
        std::memcpy(u + detail::q4_k_q + ((c * 8 + g) * panel_rows + r) * 4, blk + qs_at + 32 * c + 4 * g, 4);
      }
    }
    if constexpr (Five) {
      const std::byte* qh = blk + 16;
      for (int c = 0; c < 4; ++c)
        for (int w = 0; w < 2; ++w)
          for (int t = 0; t < 4; ++t) {
            std::uint8_t byte = 0;
            for (int g = 0; g < 4; ++g) {
              const auto bits = std::to_integer<std::uint8_t>(qh[4 * (4 * w + g) + t]);
              byte = static_cast<std::uint8_t>(byte | (((bits >> (2 * c)) & 1) << g) | (((bits >> (2 * c + 1)) & 1) << (4 + g)));
            }
            u[detail::q5_k_h + ((c * 2 + w) * panel_rows + r) * 4 + t] = std::byte{byte};
          }
    }
  });
}

// q6_k superblock: 128 bytes ql, 64 bytes qh, 16 i8 scales, f16 d.
void pack_q6_k(const source_panel& s, std::int64_t k, std::byte* dst) {
  const std::int64_t blocks = k / 256;
  std::byte* body = dst + detail::scale_run(blocks);
  each_block(s, blocks, 210, [&](int r, std::int64_t b, const std::byte* blk) {
    std::byte* u = body + b * detail::q6_k_unit;
    std::memcpy(dst + (b * panel_rows + r) * 2, blk + 208, 2);
    for (int h = 0; h < 2; ++h) {
      for (int v = 0; v < 16; ++v) std::memcpy(u + ((h * 16 + v) * panel_rows + r) * 4, blk + 64 * h + 4 * v, 4);
      for (int w = 0; w < 8; ++w) {
        std::memcpy(u + detail::q6_k_qh + ((h * 8 + w) * panel_rows + r) * 4, blk + 128 + 32 * h + 4 * w, 4);
      }
    }
    for (int j = 0; j < 16; ++j) u[detail::q6_k_scale + j * panel_rows + r] = blk[192 + j];
  });
}

// q3_k superblock: 32 bytes hmask, 64 bytes qs, 12 bytes of 6-bit scales (biased by 32), f16 d. q2_k
// (Two): 16 bytes of 4-bit scales (low) and mins (high), 64 bytes qs, f16 d, f16 dmin.
template <bool Two>
void pack_q23_k(const source_panel& s, std::int64_t k, std::byte* dst) {
  constexpr std::size_t block_bytes = Two ? 84 : 110, qs_at = Two ? 16 : 32, d_at = Two ? 80 : 108;
  constexpr std::size_t unit = Two ? detail::q2_k_unit : detail::q3_k_unit;
  const std::int64_t blocks = k / 256;
  std::byte* body = dst + detail::scale_run(blocks);
  each_block(s, blocks, block_bytes, [&](int r, std::int64_t b, const std::byte* blk) {
    std::byte* u = body + b * unit;
    std::memcpy(dst + (b * panel_rows + r) * 2, blk + d_at, 2);
    for (int n = 0; n < 2; ++n)
      for (int v = 0; v < 8; ++v) std::memcpy(u + ((n * 8 + v) * panel_rows + r) * 4, blk + qs_at + 32 * n + 4 * v, 4);
    if constexpr (Two) {
      std::memcpy(u + detail::q2_k_dmin + r * 2, blk + 82, 2);
      for (int j = 0; j < 16; ++j) u[detail::q2_k_scale + j * panel_rows + r] = blk[j];
    } else {
      for (int v = 0; v < 8; ++v) std::memcpy(u + detail::q3_k_hm + (v * panel_rows + r) * 4, blk + 4 * v, 4);
      std::uint8_t sc[12];
      std::memcpy(sc, blk + 96, 12);
      for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? (sc[j] & 0x0f) : (sc[j - 8] >> 4);
        const int high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        u[detail::q3_k_scale + j * panel_rows + r] = static_cast<std::byte>(static_cast<std::int8_t>((low | (high << 4)) - 32));
      }
    }
  });
}

// Tells `consumed` about the source rows read so far, in runs of 64 KiB or more; a report starts at
// the page that holds its first byte, so a page the previous run ended inside goes with this one.
struct consumed_reporter {
  const std::byte* base;
  const std::function<void(const tensor_view&)>& fn;
  const std::byte* from = base;  // the first source byte not yet reported
  void upto(const std::byte* to, bool last) {
    if (!fn || (to - from < (std::ptrdiff_t{1} << 16) && !last)) return;
    fn(tensor_view(dtype::u8, troupe::shape{static_cast<std::int64_t>(to - from)}, from));
    from = std::max(base, reinterpret_cast<const std::byte*>(reinterpret_cast<std::uintptr_t>(to) & ~std::uintptr_t{4095}));
  }
};

// The widest group (log 2, at most max_group_shift) of aligned consecutive blocks whose every row
// shares its block header, the first `key_bytes` of each `block_bytes`-byte block (an affine format's
// scale and zero point). Once a block matched the head of its group, every block before it in the group
// did too, so narrowing the group never needs a second look.
int uniform_group_shift(const tensor_view& w, std::int64_t n, std::int64_t k, std::size_t block_bytes,
                        std::size_t key_bytes, const std::function<void(const tensor_view&)>& consumed) {
  const std::int64_t blocks = k / 32;
  int shift = detail::max_group_shift;
  while (shift > 0 && (std::int64_t{1} << shift) > blocks) --shift;
  consumed_reporter report{w.data(), consumed};
  const std::size_t row_bytes = w.row_bytes();
  for (std::int64_t r = 0; r < n && shift > 0; ++r) {
    const std::byte* row = w.data() + static_cast<std::size_t>(r) * row_bytes;
    for (std::int64_t b = 1; b < blocks && shift > 0; ++b) {
      auto head = [&] { return row + static_cast<std::size_t>(b & ~((std::int64_t{1} << shift) - 1)) * block_bytes; };
      while (shift > 0 && std::memcmp(row + static_cast<std::size_t>(b) * block_bytes, head(), key_bytes) != 0) --shift;
    }
    report.upto(row + row_bytes, r + 1 == n);
  }
  return shift;
}

std::size_t panel_bytes(dtype t, std::int64_t k, int shift) {
  const auto uk = static_cast<std::size_t>(k);
  switch (t) {
    case dtype::f32: return uk * panel_rows * 4;
    case dtype::f16: return uk * panel_rows * 2;
    case dtype::bf16: return (uk + 1) / 2 * panel_rows * 4;
    case dtype::q8_0: return detail::paired_panel_bytes(k / 32, detail::q8_0_unit);
    case dtype::q4_0:
    case dtype::iq4_nl:
    case dtype::mxfp4: return detail::paired_panel_bytes(k / 32, detail::q4_0_unit);
    case dtype::iq4_xs: return detail::iq4_xs_blocks.panel_bytes(k / 32);
    case dtype::q4_a32: return detail::q4_a32_groups.panel_bytes(k / 32, shift);
    case dtype::q8_a32: return detail::q8_a32_groups.panel_bytes(k / 32, shift);
    case dtype::q4_1: return detail::q4_1_pairs.panel_bytes(k / 32);
    case dtype::q5_0: return detail::q5_0_pairs.panel_bytes(k / 32);
    case dtype::q5_1: return detail::q5_1_pairs.panel_bytes(k / 32);
    case dtype::fp8_s32: return uk / 32 * detail::fp8_s32_unit;
    case dtype::q4_k: return uk / 256 * detail::q4_k_unit;
    case dtype::q5_k: return uk / 256 * detail::q5_k_unit;
    case dtype::q6_k: return detail::scale_run(k / 256) + uk / 256 * detail::q6_k_unit;
    case dtype::q3_k: return detail::scale_run(k / 256) + uk / 256 * detail::q3_k_unit;
    case dtype::q2_k: return detail::scale_run(k / 256) + uk / 256 * detail::q2_k_unit;
    default: return 0;
  }
}

const detail::kernel_table& table(isa level) {
  switch (level) {
    case isa::avx512: return detail::avx512_kernels();
    case isa::avx2: return detail::avx2_kernels();
    case isa::scalar: break;
  }
  return detail::scalar_kernels();
}

const detail::format_kernel& kernel_for(const detail::kernel_table& t, dtype type) {
  switch (type) {
    case dtype::f16: return t.f16;
    case dtype::bf16: return t.bf16;
    case dtype::q8_0: return t.q8_0;
    case dtype::q4_0: return t.q4_0;
    case dtype::mxfp4: return t.mxfp4;
    case dtype::iq4_nl: return t.iq4_nl;
    case dtype::iq4_xs: return t.iq4_xs;
    case dtype::q4_a32: return t.q4_a32;
    case dtype::q8_a32: return t.q8_a32;
    case dtype::fp8_s32: return t.fp8_s32;
    case dtype::q4_1: return t.q4_1;
    case dtype::q5_0: return t.q5_0;
    case dtype::q5_1: return t.q5_1;
    case dtype::q4_k: return t.q4_k;
    case dtype::q5_k: return t.q5_k;
    case dtype::q3_k: return t.q3_k;
    case dtype::q2_k: return t.q2_k;
    case dtype::q6_k: return t.q6_k;
    default: return t.f32;
  }
}

// The calling thread's scratch for prepared activations; it only grows, so steady decode allocates
// nothing.
std::byte* scratch(std::size_t bytes) {
  thread_local detail::aligned_bytes buf;
  thread_local std::size_t capacity = 0;
  if (bytes > capacity) {
    buf = detail::allocate_aligned(bytes);
    capacity = detail::round64(bytes);
  }
  return buf.get();
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool packable(dtype t) {
  switch (t) {
    case dtype::f32:
    case dtype::f16:
    case dtype::bf16:
    case dtype::q8_0:
    case dtype::q4_0:
    case dtype::mxfp4:
    case dtype::iq4_nl:
    case dtype::iq4_xs:
    case dtype::q4_a32:
    case dtype::q8_a32:
    case dtype::fp8_s32:
    case dtype::q4_1:
    case dtype::q5_0:
    case dtype::q5_1:
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q3_k:
    case dtype::q2_k:
    case dtype::q6_k: return true;
    default: return false;
  }
}

result<packed_matrix, std::string> packed_matrix::pack_decoded(const tensor_view& w, dtype as, const std::function<void(const tensor_view&)>& consumed) {
  const dtype t = w.type();
  if (!supports_dequantize(t) || w.shape().rank() != 2 || w.data() == nullptr || (as != dtype::f16 && as != dtype::f32))
    return unexpected("matmul: a " + std::string(name(t)) + " weight " + w.shape().str() + " cannot be decoded to " + std::string(name(as)));
  const std::int64_t n = w.shape()[0], k = w.shape()[1];
  const auto block = static_cast<std::int64_t>(info(t).block_elems);
  if (n < 0 || k < 0 || k % block != 0)
    return unexpected("matmul: a " + std::string(name(t)) + " weight " + w.shape().str() + " is not whole blocks per row");
  std::vector<float> rows(static_cast<std::size_t>(n * k));
  for (std::int64_t r = 0; r < n; ++r)
    if (auto d = dequantize_row(t, w.data() + static_cast<std::size_t>(r) * w.row_bytes(), rows.data() + r * k, k); !d)
      return unexpected("matmul: " + d.error().message());
  if (consumed) consumed(w);
  if (as == dtype::f32) return pack(tensor_view(dtype::f32, w.shape(), reinterpret_cast<const std::byte*>(rows.data())));
  std::vector<std::uint16_t> half(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) half[i] = f32_to_f16(rows[i]);
  return pack(tensor_view(dtype::f16, w.shape(), reinterpret_cast<const std::byte*>(half.data())));
}

result<packed_matrix, std::string> packed_matrix::pack(const tensor_view& w, const std::function<void(const tensor_view&)>& consumed) {
  const dtype t = w.type();
  // A block format without its own kernel (q8_1, q8_k: activation formats no checkpoint stores as
  // weights): decoded once to f16 and run by the f16 kernel. f16 keeps every decoded value to 2^-11
  // relative, far inside the error of the 8-bit activations the block kernels use.
  if (!packable(t) && supports_dequantize(t) && w.shape().rank() == 2 && w.data() != nullptr) return pack_decoded(w, dtype::f16);
  if (!packable(t)) return unexpected(std::string("matmul: no packed layout for ") + std::string(name(t)));
  if (w.shape().rank() != 2) {
    return unexpected("matmul: a weight must be 2-D [N, K], got " + w.shape().str());
  }
  const std::int64_t n = w.shape()[0];
  const std::int64_t k = w.shape()[1];
  if (n < 0 || k < 0) return unexpected("matmul: negative dimension in " + w.shape().str());
  const auto block = static_cast<std::int64_t>(info(t).block_elems);
  if (k % block != 0) {
    return unexpected("matmul: K = " + std::to_string(k) + " is not a whole number of " + std::string(name(t)) +
                      " blocks");
  }
  if (n > 0 && k > 0 && !w.data()) return unexpected(std::string("matmul: weight has no data"));

  auto l = std::make_shared<layout>();
  l->type = t;
  l->rows = n;
  l->cols = k;
  l->panels = ceil_div(n, panel_rows);
  if (n > 0 && t == dtype::q4_a32) l->group_shift = uniform_group_shift(w, n, k, 20, 3, consumed);
  if (n > 0 && t == dtype::q8_a32) l->group_shift = uniform_group_shift(w, n, k, 40, 5, consumed);
  l->panel_bytes = panel_bytes(t, k, l->group_shift);
  l->data = detail::allocate_weights(static_cast<std::size_t>(l->panels) * l->panel_bytes);
  const std::size_t row_bytes = k > 0 ? w.row_bytes() : 0;
  consumed_reporter report{w.data(), consumed};
  for (std::int64_t p = 0; p < l->panels && k > 0; ++p) {
    const source_panel s{w.data(), row_bytes, p * panel_rows, n};
    std::byte* dst = l->data.get() + static_cast<std::size_t>(p) * l->panel_bytes;
    switch (t) {
      case dtype::f32: pack_f32(s, k, dst); break;
      case dtype::f16: pack_f16(s, k, dst); break;
      case dtype::bf16: pack_bf16(s, k, dst); break;
      case dtype::q8_0: pack_q32<detail::q8_0_unit, 8>(s, k, dst); break;
      case dtype::q4_0: pack_q32<detail::q4_0_unit, 4>(s, k, dst); break;
      case dtype::mxfp4: pack_mxfp4(s, k, dst); break;
      case dtype::iq4_nl: pack_q32<detail::q4_0_unit, 4>(s, k, dst); break;
      case dtype::iq4_xs: pack_iq4_xs(s, k, dst); break;
      case dtype::q4_a32: pack_q4_a32(s, k, l->group_shift, dst); break;
      case dtype::q8_a32: pack_q8_a32(s, k, l->group_shift, dst); break;
      case dtype::fp8_s32: pack_fp8_s32(s, k, dst); break;
      case dtype::q4_1: pack_q4_1_q5<true, false>(s, k, dst); break;
      case dtype::q5_0: pack_q4_1_q5<false, true>(s, k, dst); break;
      case dtype::q5_1: pack_q4_1_q5<true, true>(s, k, dst); break;
      case dtype::q4_k: pack_q45_k<false>(s, k, dst); break;
      case dtype::q5_k: pack_q45_k<true>(s, k, dst); break;
      case dtype::q3_k: pack_q23_k<false>(s, k, dst); break;
      case dtype::q2_k: pack_q23_k<true>(s, k, dst); break;
      case dtype::q6_k: pack_q6_k(s, k, dst); break;
      default: break;
    }
    report.upto(w.data() + static_cast<std::size_t>(std::min(n, (p + 1) * panel_rows)) * row_bytes, p + 1 == l->panels);
  }
  packed_matrix m;
  m.l_ = std::move(l);
  return m;
}

dtype packed_matrix::type() const { return l_->type; }
std::int64_t packed_matrix::rows() const { return l_->rows; }
std::int64_t packed_matrix::cols() const { return l_->cols; }
std::size_t packed_matrix::bytes() const { return static_cast<std::size_t>(l_->panels) * l_->panel_bytes; }

void matmul(const packed_matrix& w, const float* x, std::int64_t ldx, std::int64_t M, float* y, std::int64_t ldy,
            thread_pool& pool, isa level, const float* r, std::int64_t ldr) {
  const matmul_job job{&w, x, ldx, M, y, ldy, r, ldr};
  matmul_batch(std::span(&job, 1), pool, level);
}

void matmul_batch(std::span<const matmul_job> jobs, thread_pool& pool, isa level) {
  if (jobs.empty()) return;
  if (!usable(level)) level = best_isa();
  const detail::format_kernel& fk = kernel_for(table(level), jobs.front().w->data().type);
  const auto threads = static_cast<std::int64_t>(pool.size());

  // The caller's thread keeps these between calls, so a warm step allocates nothing here.
  struct prep_row { const float* x; std::int64_t k; std::byte* out; std::size_t block_stride; };
  struct task { std::size_t job; std::int64_t p0, p1, m0, m1; };
  // (Thread-local objects are named through these references: a worker naming `tls` would get its own.)
  struct batch_scratch {
    std::vector<detail::gemm_args> args;
    std::vector<std::size_t> same;  // per job: the job whose prepared activations it reads
    std::vector<prep_row> preps;
    std::vector<task> tasks;
    std::vector<std::size_t> live;  // jobs with work, in order
  };
  thread_local batch_scratch tls;
  batch_scratch& bs = tls;
  auto& args = bs.args;
  auto& same = bs.same;
  auto& preps = bs.preps;
  auto& tasks = bs.tasks;
  auto& live = bs.live;
  auto prepare_row = [](const detail::format_kernel& f, const prep_row& p) {
    if (f.prepare_blocks) {
      f.prepare_blocks(p.x, p.k, p.out, p.block_stride);
    } else {
      f.prepare(p.x, p.k, p.out);
    }
  };
  args.assign(jobs.size(), {});
  same.assign(jobs.size(), 0);
  preps.clear();
  tasks.clear();
  live.clear();

  // Jobs with nothing to multiply are answered here: K = 0 leaves the residual (or zeros).
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const auto& jb = jobs[j];
    const auto& l = jb.w->data();
    if (jb.M <= 0 || l.rows <= 0) continue;
    if (l.cols == 0) {
      for (std::int64_t m = 0; m < jb.M; ++m)
        for (std::int64_t n = 0; n < l.rows; ++n) jb.y[m * jb.ldy + n] = jb.r ? jb.r[m * jb.ldr + n] : 0.0f;
      continue;
    }
    live.push_back(j);
  }
  if (live.empty()) return;

  // Activations: one preparation per distinct (x, M, ldx, K).
  for (const std::size_t j : live) {
    const auto& jb = jobs[j];
    auto& a = args[j];
    a.w = &jb.w->data();
    a.y = jb.y;
    a.ldy = jb.ldy;
    a.r = jb.r;
    a.ldr = jb.ldr;
    if (!fk.act_bytes) {
      a.acts = reinterpret_cast<const std::byte*>(jb.x);
      a.act_stride = static_cast<std::size_t>(jb.ldx) * sizeof(float);
    }
  }
  if (fk.act_bytes) {
    std::size_t total = 0;
    for (const std::size_t j : live) {
      const auto& jb = jobs[j];
      std::size_t owner = j;
      for (const std::size_t i : live) {
        if (i >= j) break;
        if (same[i] == i && jobs[i].x == jb.x && jobs[i].M == jb.M && jobs[i].ldx == jb.ldx && jobs[i].w->data().cols == jb.w->data().cols) {
          owner = i;
          break;
        }
      }
      same[j] = owner;
      if (owner == j) {
        // Row-major: act_stride is a row's bytes; block-major: a group's (act_bytes is per group).
        args[j].act_stride = detail::round64(fk.act_bytes(jb.w->data().cols));
        total += args[j].act_stride * static_cast<std::size_t>(fk.prepare_blocks ? ceil_div(jb.M, detail::act32_group) : jb.M);
      }
    }
    std::byte* acts = scratch(std::max<std::size_t>(total, 64));
    std::size_t at = 0;
    for (const std::size_t j : live) {
      const auto& jb = jobs[j];
      if (same[j] == j) {
        args[j].acts = acts + at;
        const std::size_t stride = args[j].act_stride;
        for (std::int64_t m = 0; m < jb.M; ++m) {
          const std::size_t row_at = fk.prepare_blocks ? static_cast<std::size_t>(m / detail::act32_group) * stride + static_cast<std::size_t>(m % detail::act32_group) * detail::act32_unit
                                                       : static_cast<std::size_t>(m) * stride;
          preps.push_back({jb.x + m * jb.ldx, jb.w->data().cols, acts + at + row_at, detail::act32_unit * detail::act32_group});
        }
        at += stride * static_cast<std::size_t>(fk.prepare_blocks ? ceil_div(jb.M, detail::act32_group) : jb.M);
      } else {
        args[j].acts = args[same[j]].acts;
        args[j].act_stride = args[same[j]].act_stride;
      }
    }
    // Preparing a row costs about as much as one output panel of it, so rows are spread only when
    // there are enough to pay for a dispatch.
    const auto rows = static_cast<std::int64_t>(preps.size());
    if (rows >= 4 * threads && threads > 1) {
      const std::int64_t per = ceil_div(rows, 4 * threads);
      pool.parallel_for(ceil_div(rows, per), [&](std::int64_t t, int) {
        for (std::int64_t i = t * per; i < std::min(rows, (t + 1) * per); ++i) prepare_row(fk, preps[static_cast<std::size_t>(i)]);
      });
    } else {
      for (const auto& p : preps) prepare_row(fk, p);
    }
  }

  // Tasks are (panel range, row range) rectangles; output rows of a panel are 64 bytes, so tasks share
  // no cache line unless ldy is not a multiple of 16. Few rows (decode) split the panels of every job,
  // taken as one sequence, into shrinking ranges (each a share of what is left): big first tasks keep
  // claims few, and the last ones are a panel or two, so neither thread waits long for the other at
  // the end; a range that crosses from one job into the next becomes a task in each. Many rows
  // (prefill) split each job's rows into chunks that stay cache-resident while a task walks its
  // panels, and its panels evenly.
  std::int64_t max_m = 0, panels = 0;
  for (const std::size_t j : live) {
    max_m = std::max(max_m, jobs[j].M);
    panels += args[j].w->panels;
  }
  if (max_m <= 64) {
    std::int64_t done = 0;
    std::size_t li = 0;
    std::int64_t job_first = 0;  // the global index of live[li]'s first panel
    while (done < panels) {
      const std::int64_t left = panels - done;
      const std::int64_t step = threads == 1 ? left : ceil_div(left, 2 * threads);
      const std::int64_t end = done + step;
      while (done < end) {
        const std::size_t j = live[li];
        const std::int64_t job_end = job_first + args[j].w->panels;
        const std::int64_t to = std::min(end, job_end);
        tasks.push_back({j, done - job_first, to - job_first, 0, jobs[j].M});
        done = to;
        if (done == job_end) {
          job_first = job_end;
          ++li;
        }
      }
    }
  } else {
    for (const std::size_t j : live) {
      const std::int64_t M = jobs[j].M, jp = args[j].w->panels;
      const std::int64_t m_chunk = M <= 64 ? M : std::min<std::int64_t>(M, 128);
      const std::int64_t m_tasks = ceil_div(M, m_chunk);
      const std::int64_t p_tasks = threads == 1 ? 1 : std::clamp<std::int64_t>(ceil_div(6 * threads, m_tasks), 1, std::min<std::int64_t>(jp, 96));
      const std::int64_t p_chunk = ceil_div(jp, p_tasks);
      for (std::int64_t p0 = 0; p0 < jp; p0 += p_chunk)
        for (std::int64_t m0 = 0; m0 < M; m0 += m_chunk) tasks.push_back({j, p0, std::min(jp, p0 + p_chunk), m0, std::min(M, m0 + m_chunk)});
    }
  }
  auto run = [&](std::int64_t t, int) {
    const auto& tk = tasks[static_cast<std::size_t>(t)];
    detail::gemm_args b = args[tk.job];
    b.p0 = tk.p0;
    b.p1 = tk.p1;
    b.m0 = tk.m0;
    b.m1 = tk.m1;
    fk.compute(b);
  };
  if (tasks.size() == 1 || threads == 1) {
    for (std::size_t t = 0; t < tasks.size(); ++t) run(static_cast<std::int64_t>(t), 0);
  } else {
    pool.parallel_for(static_cast<std::int64_t>(tasks.size()), run);
  }
}

void gather_rows(const tensor_view& table, const std::int32_t* ids, std::int64_t n, float* out) {
  const std::int64_t k = table.shape().back();
  const std::size_t row_bytes = table.row_bytes();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::byte* src = table.data() + static_cast<std::size_t>(ids[i]) * row_bytes;
    float* dst = out + i * k;
    if (table.type() == dtype::f32) {
      std::memcpy(dst, src, static_cast<std::size_t>(k) * sizeof(float));
    } else if (!dequantize_row(table.type(), src, dst, k)) {
      // A table core cannot decode reads as NaN rather than as plausible numbers.
      std::fill(dst, dst + k, std::numeric_limits<float>::quiet_NaN());
    }
  }
}

}  // namespace troupe::exec::cpu

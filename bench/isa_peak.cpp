// The arithmetic peak of this machine's vector units, per instruction kind the matrix kernels can use:
// f32 FMA (AVX2 and AVX-512), bf16 dot products (AVX512_BF16 vdpbf16ps), int8 dot products (AVX-512
// VNNI vpdpbusd, AVX-VNNI), f16 FMA (AVX512_FP16) and the AMX tiles (tdpbssd int8, tdpbf16ps bf16),
// each where the CPU has it (detected at run time; AMX also needs the kernel's permission,
// arch_prctl(ARCH_REQ_XCOMP_PERM)). Each kind runs independent accumulator chains in registers (no
// memory traffic) on N threads at once and reports operations per second: a multiply and an add count
// as two (an int8 MAC too). What a format's prefill reaches is held against these in
// bench/results/isa-peak.md. usage: troupe_isa_peak [--threads N] [--json]
// GCC 12 reports its own _mm512_undefined_* helpers as uninitialized where an AVX-512 intrinsic is
// inlined (GCC bug 105593), as kernels_avx512.cpp notes.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cpuid.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <immintrin.h>

namespace {

struct cpu_has {
  bool avx2 = false, fma = false, avx512f = false, avx512bf16 = false, avx512vnni = false, avxvnni = false, avx512fp16 = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false, os_avx512 = false, os_avx = false;
};

cpu_has detect() {
  cpu_has h;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return h;
  h.fma = c & (1u << 12);
  const bool osxsave = c & (1u << 27);
  std::uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<std::uint64_t>(hi) << 32) | lo;
  }
  h.os_avx = (xcr0 & 0x6) == 0x6;
  h.os_avx512 = (xcr0 & 0xe6) == 0xe6;
  __cpuid_count(7, 0, a, b, c, d);
  h.avx2 = (b & (1u << 5)) && h.os_avx;
  h.avx512f = (b & (1u << 16)) && h.os_avx512;
  h.avx512vnni = (c & (1u << 11)) && h.avx512f;
  h.avx512fp16 = (d & (1u << 23)) && h.avx512f;
  h.amx_bf16 = d & (1u << 22);
  h.amx_tile = d & (1u << 24);
  h.amx_int8 = d & (1u << 25);
  __cpuid_count(7, 1, a, b, c, d);
  h.avx512bf16 = (a & (1u << 5)) && h.avx512f;
  h.avxvnni = (a & (1u << 4)) && h.avx2;
  return h;
}

// Each kernel runs `iters` rounds of 12 independent chains (enough to cover the latency of two
// pipes) and returns a value that depends on every chain, so nothing is optimized away.
constexpr int chains = 12;

__attribute__((target("avx2,fma"))) float fma_avx2(std::int64_t iters) {
  __m256 acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 x = _mm256_set1_ps(0.9999f), y = _mm256_set1_ps(1e-7f);
  for (std::int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  __m256 s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
}

// AVX2 without VNNI: a u8 x s8 byte dot is vpmaddubsw (pairs into saturating int16), vpmaddwd against
// ones (pairs of those into int32) and vpaddd, 32 MACs per three instructions. With `Signed` the chain
// also moves a weight's sign onto the activation first (vpsignb), as a q8_0 dot of two signed operands
// must: the form the q8_0 kernels run on this level. Each step reads its own chain's accumulator, so
// no product is loop-invariant (with constant operands GCC hoists the byte dot out of the loop and
// the row measures vpaddd alone).
template <bool Signed>
__attribute__((target("avx2"))) float dp_int8_avx2(std::int64_t iters) {
  __m256i acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i x = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  const __m256i y = _mm256_set1_epi8(-2);
  for (std::int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) {
      const __m256i s = Signed ? _mm256_sign_epi8(y, acc[i]) : y;
      const __m256i u = Signed ? x : acc[i];
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
    }
  }
  __m256i s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm256_add_epi32(s, acc[i]);
  return static_cast<float>(_mm256_extract_epi32(s, 0));
}

__attribute__((target("avx512f"))) float fma_avx512(std::int64_t iters) {
  __m512 acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 x = _mm512_set1_ps(0.9999f), y = _mm512_set1_ps(1e-7f);
  for (std::int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512bf16"))) float dp_bf16(std::int64_t iters) {
  __m512 acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
  for (std::int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) float dp_int8_avx512(std::int64_t iters) {
  __m512i acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-2);
  for (std::int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], x, y);
  __m512i s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm512_add_epi32(s, acc[i]);
  return static_cast<float>(_mm512_reduce_add_epi32(s));
}

__attribute__((target("avx2,avxvnni"))) float dp_int8_avxvnni(std::int64_t iters) {
  __m256i acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-2);
  for (std::int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) acc[i] = _mm256_dpbusd_avx_epi32(acc[i], x, y);
  __m256i s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm256_add_epi32(s, acc[i]);
  return static_cast<float>(_mm256_extract_epi32(s, 0));
}

__attribute__((target("avx512f,avx512fp16"))) float fma_fp16(std::int64_t iters) {
  __m512h acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm512_set1_ph(static_cast<_Float16>(0.001f * i));
  const __m512h x = _mm512_set1_ph(static_cast<_Float16>(0.999f)), y = _mm512_set1_ph(static_cast<_Float16>(1e-4f));
  for (std::int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) acc[i] = _mm512_fmadd_ph(acc[i], x, y);
  __m512h s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm512_add_ph(s, acc[i]);
  return static_cast<float>(_mm512_reduce_add_ph(s));
}

// AMX: tiles 0-3 accumulate, 4-5 and 6-7 are the A and B operands (16 rows of 64 bytes each).
struct alignas(64) tile_config {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

bool amx_permitted() {
  constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
  return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
}

__attribute__((target("amx-tile,amx-int8"))) float amx_int8(std::int64_t iters) {
  tile_config cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) static thread_local std::int8_t buf[16 * 64];
  std::memset(buf, 1, sizeof buf);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  for (std::int64_t it = 0; it < iters; ++it) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  alignas(64) static thread_local std::int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return static_cast<float>(out[0]);
}

__attribute__((target("amx-tile,amx-bf16"))) float amx_bf16(std::int64_t iters) {
  tile_config cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) static thread_local std::uint16_t buf[16 * 32];
  for (auto& v : buf) v = 0x3f80;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  for (std::int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) static thread_local float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

struct kind {
  const char* name;
  const char* what;
  bool present;
  std::string absent_reason;
  double ops_per_iter;  // per thread, per iteration of the kernel
  std::function<float(std::int64_t)> run;
};

// Operations per second over `threads` threads each running `iters` iterations.
double measure(const kind& k, int threads, std::int64_t iters) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  std::vector<float> sink(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      sink[static_cast<std::size_t>(t)] = k.run(iters / 16);  // warm the unit (AVX-512 license, AMX state)
      ready.fetch_add(1);
      while (!go.load()) {
      }
      sink[static_cast<std::size_t>(t)] += k.run(iters);
    });
  while (ready.load() < threads) {
  }
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& th : ts) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float keep = 0;
  for (float v : sink) keep = keep + v;
  (void)keep;
  return k.ops_per_iter * static_cast<double>(iters) * threads / s;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--json") == 0) json = true;
  }
  const auto h = detect();
  const bool amx_perm = (h.amx_int8 || h.amx_bf16) && amx_permitted();
  auto reason = [](bool cpu, const char* what) { return cpu ? std::string() : std::string("this CPU lacks ") + what; };
  std::vector<kind> kinds = {
      {"f32_fma_avx2", "vfmadd231ps ymm (8 f32 FMA)", h.avx2 && h.fma, reason(h.avx2 && h.fma, "AVX2/FMA"), chains * 16.0, fma_avx2},
      {"int8_dot_avx2", "vpmaddubsw+vpmaddwd+vpaddd ymm (32 u8 x s8 MAC)", h.avx2, reason(h.avx2, "AVX2"), chains * 64.0,
       dp_int8_avx2<false>},
      {"int8_q8_avx2", "vpsignb+vpmaddubsw+vpmaddwd+vpaddd ymm (32 s8 x s8 MAC)", h.avx2, reason(h.avx2, "AVX2"), chains * 64.0,
       dp_int8_avx2<true>},
      {"f32_fma_avx512", "vfmadd231ps zmm (16 f32 FMA)", h.avx512f, reason(h.avx512f, "AVX-512F"), chains * 32.0, fma_avx512},
      {"bf16_dot_avx512", "vdpbf16ps zmm (32 bf16 MAC into f32)", h.avx512bf16, reason(h.avx512bf16, "AVX512_BF16"), chains * 64.0, dp_bf16},
      {"f16_fma_avx512", "vfmadd231ph zmm (32 f16 FMA)", h.avx512fp16, reason(h.avx512fp16, "AVX512_FP16"), chains * 64.0, fma_fp16},
      {"int8_dot_avx512", "vpdpbusd zmm (64 u8 x s8 MAC)", h.avx512vnni, reason(h.avx512vnni, "AVX512_VNNI"), chains * 128.0, dp_int8_avx512},
      {"int8_dot_avxvnni", "vpdpbusd ymm (32 u8 x s8 MAC)", h.avxvnni, reason(h.avxvnni, "AVX-VNNI"), chains * 64.0, dp_int8_avxvnni},
      {"int8_amx", "tdpbssd (16x16x64 s8 MAC per tile op)", h.amx_int8 && amx_perm,
       h.amx_int8 ? (amx_perm ? "" : "the kernel refused AMX's permission (arch_prctl)") : "this CPU lacks AMX-INT8", 4 * 16.0 * 16 * 64 * 2,
       amx_int8},
      {"bf16_amx", "tdpbf16ps (16x16x32 bf16 MAC per tile op)", h.amx_bf16 && amx_perm,
       h.amx_bf16 ? (amx_perm ? "" : "the kernel refused AMX's permission (arch_prctl)") : "this CPU lacks AMX-BF16", 4 * 16.0 * 16 * 32 * 2,
       amx_bf16},
  };
  if (json) std::printf("{\"threads\": %d, \"peaks\": [", threads);
  else std::printf("%-18s %-58s %12s\n", "kind", "instruction", "GOPS");
  bool first = true;
  for (const auto& k : kinds) {
    if (!k.present) {
      if (json) {
        std::printf("%s{\"kind\": \"%s\", \"absent\": \"%s\"}", first ? "" : ", ", k.name, k.absent_reason.c_str());
        first = false;
      } else {
        std::printf("%-18s %-58s %12s  (%s)\n", k.name, k.what, "-", k.absent_reason.c_str());
      }
      continue;
    }
    // About 0.3 s of work per thread at a few GHz.
    const std::int64_t iters = std::strstr(k.name, "amx") ? 2'000'000 : 40'000'000;
    const double ops = measure(k, threads, iters);
    if (json) {
      std::printf("%s{\"kind\": \"%s\", \"gops\": %.1f}", first ? "" : ", ", k.name, ops / 1e9);
      first = false;
    } else {
      std::printf("%-18s %-58s %12.1f\n", k.name, k.what, ops / 1e9);
    }
  }
  if (json) std::printf("]}\n");
  return 0;
}

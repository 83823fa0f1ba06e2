// Whether the avx512 level may use the AMX tiles, decided once: the CPU has them and the OS saves them
// (isa.cpp's features()), the kernel lets this process use them (arch_prctl(ARCH_REQ_XCOMP_PERM)), and the
// hardware's products equal the emulation's on a check product, run under a SIGILL guard. Also the
// emulated products (detail/amx_tiles.hpp over amx_emulated), compiled here for any CPU.
#include <csetjmp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/half.hpp"
#include "engine/exec/cpu/detail/amx_tiles.hpp"
#include "engine/exec/cpu/isa.hpp"
#include "engine/exec/cpu/matmul.hpp"

#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace troupe::exec::cpu {

namespace detail {
void amx_bf16_rows_emulated(const gemm_args& a) { amx_bf16_rows<amx_emulated>(a); }
void amx_q8_0_rows_emulated(const gemm_args& a) { amx_q8_0_rows<amx_emulated>(a); }
}  // namespace detail

namespace {

#if defined(__x86_64__)
bool amx_permitted() {
  constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
  return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
}
#endif

sigjmp_buf* sigill_target = nullptr;
extern "C" void on_sigill(int) { siglongjmp(*sigill_target, 1); }

// Runs f; false when it raised SIGILL (the CPU or the kernel refused an instruction after all).
template <class F>
bool runs_without_sigill(F&& f) {
  struct sigaction sa {}, old {};
  sa.sa_handler = on_sigill;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGILL, &sa, &old);
  sigjmp_buf env;
  sigill_target = &env;
  bool ok = false;
  if (sigsetjmp(env, 1) == 0) {
    f();
    ok = true;
  }
  sigaction(SIGILL, &old, nullptr);
  sigill_target = nullptr;
  return ok;
}

// The check products: 32 rows of 64 columns of W (two panels) against 32 rows of activations, with a
// residual, by the hardware and by the emulation; they must agree within f32 rounding.
bool close(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float d = a[i] - b[i];
    if (!(d <= 1e-4f * (1.0f + std::abs(b[i])) && -d <= 1e-4f * (1.0f + std::abs(b[i])))) return false;
  }
  return true;
}

bool check(dtype type, void (*hardware)(const detail::gemm_args&), void (*emulated)(const detail::gemm_args&)) {
  constexpr std::int64_t N = 32, K = 64, M = 32;
  std::vector<std::byte> wb;
  if (type == dtype::bf16) {
    wb.resize(N * K * 2);
    for (std::int64_t i = 0; i < N * K; ++i) {
      const std::uint16_t h = f32_to_bf16(static_cast<float>((i * 7 + 3) % 17 - 8) / 8.0f);
      std::memcpy(wb.data() + 2 * i, &h, 2);
    }
  } else {
    wb.resize(N * (K / 32) * 34);
    for (std::int64_t blk = 0; blk < N * (K / 32); ++blk) {
      const std::uint16_t d = f32_to_f16(0.01f * static_cast<float>(blk % 5 + 1));
      std::memcpy(wb.data() + blk * 34, &d, 2);
      for (int j = 0; j < 32; ++j) wb[static_cast<std::size_t>(blk * 34 + 2 + j)] = static_cast<std::byte>(static_cast<std::int8_t>((blk * 31 + j * 13) % 255 - 127));
    }
  }
  auto w = packed_matrix::pack(tensor_view(type, troupe::shape{N, K}, wb.data()));
  if (!w) return false;
  detail::gemm_args a;
  a.w = &w->data();
  std::vector<std::byte> acts;
  if (type == dtype::bf16) {
    a.act_stride = detail::round64(K * 2);
    acts.resize(a.act_stride * M);
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t k = 0; k < K; ++k) {
        const std::uint16_t h = f32_to_bf16(static_cast<float>((m * 5 + k * 11) % 13 - 6) / 4.0f);
        std::memcpy(acts.data() + m * a.act_stride + 2 * k, &h, 2);
      }
  } else {
    a.act_stride = detail::round64(detail::act32_group_bytes(K));
    acts.resize(a.act_stride * (M / detail::act32_group));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t b = 0; b < K / 32; ++b) {
        std::byte* u = acts.data() + (m / 8) * a.act_stride + b * 8 * detail::act32_unit + (m % 8) * detail::act32_unit;
        for (int j = 0; j < 32; ++j) u[j] = static_cast<std::byte>(static_cast<std::int8_t>((m * 17 + b * 7 + j * 29) % 255 - 127));
        const float d = 0.02f * static_cast<float>(m % 3 + 1);
        std::memcpy(u + 32, &d, 4);
      }
  }
  a.acts = acts.data();
  std::vector<float> r(M * N), hw(M * N), emu(M * N);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = static_cast<float>(i % 7) - 3.0f;
  a.ldy = N;
  a.r = r.data();
  a.ldr = N;
  a.m0 = 0, a.m1 = M, a.p0 = 0, a.p1 = N / 16;
  a.y = emu.data();
  emulated(a);
  a.y = hw.data();
  return runs_without_sigill([&] { hardware(a); }) && close(hw, emu);
}

amx_status decide() {
  amx_status s;
  if (const char* e = std::getenv("TROUPE_CPU_AMX"); e && std::string(e) == "0") {
    s.why_not = "turned off by TROUPE_CPU_AMX=0";
    return s;
  }
#if defined(__x86_64__)
  if (detected_isa() != isa::avx512) {
    s.why_not = "the CPU lacks the avx512 level";
    return s;
  }
  const auto& c = features();
  if (!c.amx_cpu) {
    s.why_not = "this CPU lacks AMX";
    return s;
  }
  if (!c.amx_tile || (!c.amx_bf16 && !c.amx_int8)) {
    s.why_not = "the OS does not enable the tile state (XCR0)";
    return s;
  }
  if (!amx_permitted()) {
    s.why_not = "the kernel refused AMX's permission (arch_prctl)";
    return s;
  }
  if (c.amx_bf16 && has_bf16_dot()) {
    s.bf16 = check(dtype::bf16, detail::amx_bf16_rows_hardware, detail::amx_bf16_rows_emulated);
    if (!s.bf16) s.why_not = "AMX-BF16 products differ from the emulation's";
  }
  if (c.amx_int8) {
    s.int8 = check(dtype::q8_0, detail::amx_q8_0_rows_hardware, detail::amx_q8_0_rows_emulated);
    if (!s.int8) s.why_not += std::string(s.why_not.empty() ? "" : "; ") + "AMX-INT8 products differ from the emulation's";
  }
#else
  s.why_not = "not an x86-64 CPU";
#endif
  return s;
}

}  // namespace

const amx_status& amx() {
  static const amx_status s = decide();
  return s;
}

}  // namespace troupe::exec::cpu

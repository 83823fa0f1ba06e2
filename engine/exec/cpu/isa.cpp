#include "engine/exec/cpu/isa.hpp"

#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TROUPE_CPU_X86 1
#endif

namespace troupe::exec::cpu {
namespace {

#if defined(TROUPE_CPU_X86)
struct regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

regs cpuid(unsigned leaf, unsigned sub) {
  regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return {};
  return r;
}

// XCR0 says which register files the OS saves on a context switch; a CPU bit is no use without it.
std::uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned v, int i) { return ((v >> i) & 1u) != 0; }

cpu_features detect() {
  cpu_features f;
  const unsigned max_leaf = cpuid(0, 0).a;
  if (max_leaf < 1) return f;
  const regs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.c, 27);
  if (!osxsave) return f;
  const std::uint64_t xcr0 = xgetbv0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM and YMM state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (!os_avx || !bit(l1.c, 28)) return f;
  f.fma = bit(l1.c, 12);
  f.f16c = bit(l1.c, 29);
  if (max_leaf < 7) return f;
  const regs l7 = cpuid(7, 0);
  f.avx2 = bit(l7.b, 5);
  if ((xcr0 & (std::uint64_t{3} << 17)) == (std::uint64_t{3} << 17)) {  // XTILECFG and XTILEDATA saved
    f.amx_bf16 = bit(l7.d, 22);
    f.amx_tile = bit(l7.d, 24);
    f.amx_int8 = bit(l7.d, 25);
  }
  f.amx_cpu = bit(l7.d, 24);
  if (os_avx512) {
    f.avx512f = bit(l7.b, 16);
    f.avx512dq = bit(l7.b, 17);
    f.avx512bw = bit(l7.b, 30);
    f.avx512vl = bit(l7.b, 31);
    f.avx512_vnni = bit(l7.c, 11);
    if (l7.a >= 1) f.avx512_bf16 = bit(cpuid(7, 1).a, 5);
  }
  return f;
}
#else
cpu_features detect() { return {}; }
#endif

isa level_of(const cpu_features& f) {
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni) return isa::avx512;
  if (avx2) return isa::avx2;
  return isa::scalar;
}

}  // namespace

std::string_view isa_name(isa level) {
  switch (level) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "scalar";
}

std::optional<isa> isa_from_name(std::string_view name) {
  if (name == "scalar") return isa::scalar;
  if (name == "avx2") return isa::avx2;
  if (name == "avx512") return isa::avx512;
  return std::nullopt;
}

const cpu_features& features() {
  static const cpu_features f = detect();
  return f;
}

isa detected_isa() {
  static const isa level = level_of(features());
  return level;
}

isa apply_isa_request(isa detected, std::string_view requested) {
  const auto want = isa_from_name(requested);
  return want && *want < detected ? *want : detected;
}

isa best_isa() {
  static const isa level = [] {
    const char* env = std::getenv("TROUPE_CPU_ISA");
    return env ? apply_isa_request(detected_isa(), env) : detected_isa();
  }();
  return level;
}

bool usable(isa level) { return level <= best_isa(); }

bool has_bf16_dot() { return detected_isa() == isa::avx512 && features().avx512_bf16; }

}  // namespace troupe::exec::cpu

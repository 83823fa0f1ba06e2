#pragma once
// The SIMD levels the CPU kernels are written for, detected once at run time. Every kernel has a path
// per level and gives the same results within its stated tolerance on each, so a test can force a
// lower level on a machine that has a higher one.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace troupe::exec::cpu {

enum class isa : std::uint8_t {
  scalar,  // portable C++
  avx2,    // AVX2 + FMA + F16C
  avx512,  // AVX-512 F/BW/VL/DQ + VNNI (+ BF16 where present)
};

std::string_view isa_name(isa level);
std::optional<isa> isa_from_name(std::string_view name);

// What the CPU and the operating system support (the OS must save the wider registers).
struct cpu_features {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512_vnni = false, avx512_bf16 = false;
  bool avx512dq = false;
  // AMX: amx_cpu when CPUID lists the tiles; the tile, int8 and bf16 bits only when the OS also saves
  // the tile state (XCR0). The kernel's permission is asked for separately (amx()).
  bool amx_cpu = false, amx_tile = false, amx_int8 = false, amx_bf16 = false;
};
const cpu_features& features();

// The best level this CPU runs, lowered by the environment variable TROUPE_CPU_ISA
// (scalar | avx2 | avx512) when that names a lower level; `usable(level)` says whether a level may be
// forced. The avx512 level needs VNNI as well: its sources are compiled with it, so the compiler may
// emit it anywhere in them.
isa detected_isa();  // ignores TROUPE_CPU_ISA
isa best_isa();
bool usable(isa level);

// The level a TROUPE_CPU_ISA value leaves in force on a CPU whose best level is `detected`: the named
// level when it is lower, else `detected` (an unknown name changes nothing).
isa apply_isa_request(isa detected, std::string_view requested);

// Whether the avx512 kernels may use vdpbf16ps (bf16 weights against bf16-rounded activations).
bool has_bf16_dot();

// The AMX tiles (Sapphire Rapids and later), which the avx512 level uses for products of 16 rows and
// more: tdpbf16ps for bf16 weights (with has_bf16_dot's bf16 activations), tdpbssd for q8_0. Each is
// used where the CPU has it (CPUID), the OS saves the tile state (XCR0), the kernel permits it
// (arch_prctl(ARCH_REQ_XCOMP_PERM)) and its products equal the emulation's on a check product
// (engine/exec/cpu/amx.cpp), decided once; `why_not` says what stopped one. TROUPE_CPU_AMX=0 turns
// both off, as TROUPE_CPU_ISA below avx512 does.
struct amx_status {
  bool bf16 = false, int8 = false;
  std::string why_not;
};
const amx_status& amx();

}  // namespace troupe::exec::cpu

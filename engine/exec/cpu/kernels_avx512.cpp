// The AVX-512 instantiation of the kernels (compiled with -mavx512f/bw/vl/dq and the AVX2 flags).
//
// GCC 12 reports the self-initialization inside its own _mm512_undefined_* helpers as
// (maybe-)uninitialized wherever an AVX-512 intrinsic is inlined (GCC bug 105593, fixed in GCC 13), and
// checks the pragma at the outermost caller, so both warnings are off for this file. The same templates
// are still checked by the scalar and AVX2 instantiations.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "engine/exec/cpu/detail/kernels_impl.hpp"

namespace troupe::exec::cpu::kernels_detail {

const kernel_table& avx512_kernels() {
  static constexpr kernel_table table = make_kernel_table<simd_avx512>();
  return table;
}

}  // namespace troupe::exec::cpu::kernels_detail

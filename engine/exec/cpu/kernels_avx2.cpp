// The AVX2 + FMA instantiation of the kernels (compiled with -mavx2 -mfma -mf16c).
#include "engine/exec/cpu/detail/kernels_impl.hpp"

namespace troupe::exec::cpu::kernels_detail {

const kernel_table& avx2_kernels() {
  static constexpr kernel_table table = make_kernel_table<simd_avx2>();
  return table;
}

}  // namespace troupe::exec::cpu::kernels_detail

// The dispatchers of kernels.hpp and the portable (scalar) instantiation of the kernels. Attention's
// task planning lives in attention.cpp.
#include "engine/exec/cpu/kernels.hpp"

#include "engine/exec/cpu/detail/kernels_impl.hpp"

namespace troupe::exec::cpu {

namespace kernels_detail {

const kernel_table& scalar_kernels() {
  static constexpr kernel_table table = make_kernel_table<simd_scalar>();
  return table;
}

const kernel_table& kernels_for(isa level) {
  if (level == isa::avx512 && usable(isa::avx512)) return avx512_kernels();
  if (level != isa::scalar && usable(isa::avx2)) return avx2_kernels();
  return scalar_kernels();
}

}  // namespace kernels_detail

void rms_norm(const float* x, const float* w, std::int64_t rows, std::int64_t n, float eps, float* y, isa level) {
  if (rows <= 0 || n <= 0) return;
  kernels_detail::kernels_for(level).rms_norm(x, w, rows, n, eps, y);
}

void to_f16(const float* x, std::int64_t n, std::uint16_t* y, isa level) {
  if (n > 0) kernels_detail::kernels_for(level).to_f16(x, n, y);
}

void ssm_scan_heads(const ssm_scan_args& a, std::int64_t h0, std::int64_t h1, isa level) {
  if (h1 > h0) kernels_detail::kernels_for(level).ssm_scan_heads(a, h0, h1);
}

void delta_rule_heads(const delta_rule_args& a, std::int64_t h0, std::int64_t h1, isa level) {
  if (h1 > h0) kernels_detail::kernels_for(level).delta_rule_heads(a, h0, h1);
}

void ssm_conv_channels(const ssm_conv_args& a, std::int64_t c0, std::int64_t c1, isa level) {
  if (c1 > c0) kernels_detail::kernels_for(level).ssm_conv_channels(a, c0, c1);
}

void binary(binary_kind k, const float* a, bool a_scalar, const float* b, bool b_scalar, std::int64_t n, float* y, isa level) {
  if (n > 0) kernels_detail::kernels_for(level).binary(k, a, a_scalar, b, b_scalar, n, y);
}

void layer_norm(const float* x, const float* w, const float* b, std::int64_t rows, std::int64_t n, float eps, float* y,
                isa level) {
  if (rows <= 0 || n <= 0) return;
  kernels_detail::kernels_for(level).layer_norm(x, w, b, rows, n, eps, y);
}

void rope(float* x, std::int64_t T, std::int64_t H, std::int64_t D, const std::int32_t* pos, const float* inv_freq,
          std::int64_t half, bool neox, float scale, isa level) {
  if (T <= 0 || H <= 0 || half <= 0) return;
  kernels_detail::kernels_for(level).rope(x, T, H, D, pos, inv_freq, half, neox, scale);
}

void softmax_rows(const float* x, std::int64_t rows, std::int64_t n, bool log, float* y, isa level) {
  if (rows <= 0 || n <= 0) return;
  kernels_detail::kernels_for(level).softmax_rows(x, rows, n, log, y);
}

void unary(unary_kind k, const float* x, std::int64_t n, float* y, isa level) {
  if (n <= 0) return;
  kernels_detail::kernels_for(level).unary(k, x, n, y);
}

void gated(unary_kind act, const float* g, const float* u, std::int64_t n, float* y, isa level) {
  if (n <= 0) return;
  kernels_detail::kernels_for(level).gated(act, g, u, n, y);
}

}  // namespace troupe::exec::cpu

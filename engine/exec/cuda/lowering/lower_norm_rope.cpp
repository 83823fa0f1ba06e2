// Norms and rotary embeddings.
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_norm_rope(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::rms_norm: case op::layer_norm: {
      const std::int64_t N = ot.dims.back();
      const std::int64_t rows = N ? n / N : 0;
      if (T(e.inputs[1]).type != dtype::f32 || (e.code == op::layer_norm && T(e.inputs[2]).type != dtype::f32))
        return exec_error{exec_error_code::unsupported, where, "norm weights must be f32 (or constant, folded to f32)"};
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* w = reinterpret_cast<const float*>(P(e.inputs[1]));
      const auto* b = e.code == op::layer_norm ? reinterpret_cast<const float*>(P(e.inputs[2])) : nullptr;
      const auto eps = static_cast<float>(e.attrs.eps);
      return device([=] { launch_norm(x, w, b, rows, N, eps, reinterpret_cast<float*>(out), st); });
    }
    case op::rope: {
      const std::int64_t Tn = ot.dims[0], H = ot.dims[1], D = ot.dims[2];
      const auto* x = P(e.inputs[0]);
      const auto* pos = P(e.inputs[1]);
      const auto pos_type = T(e.inputs[1]).type;
      if (pos_type != dtype::i32 && pos_type != dtype::i64)
        return exec_error{exec_error_code::unsupported, where, "positions of type " + std::string(troupe::name(pos_type))};
      const auto* inv = reinterpret_cast<const float*>(P(e.inputs[2]));
      const std::int64_t half = T(e.inputs[2]).dims[0];
      const bool neox = e.attrs.neox;
      const auto scale = static_cast<float>(e.attrs.scale);
      if (x != out)
        en.program.push_back({[=, this]() -> std::optional<exec_error> {
          return check(cudaMemcpyAsync(out, x, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToDevice, st), where, true);
        }});
      return device([=] { launch_rope(reinterpret_cast<float*>(out), Tn, H, D, pos_type, pos, inv, half, neox, scale, st); });
    }
    default: break;
  }
  return exec_error{exec_error_code::unsupported, where, "no CUDA lowering"};
}

}  // namespace troupe::exec::cuda

// Norms and rotary embeddings.
#include "engine/exec/cpu/lowering/lower.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::exec::cpu::lowering {

instr lower_norm_rope(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::rms_norm: case op::layer_norm: {
      const std::int64_t N = ot.dims.back();
      const std::int64_t rows = N ? n / N : 0;
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* w = reinterpret_cast<const float*>(P(e.inputs[1]));
      const auto* b = e.code == op::layer_norm ? reinterpret_cast<const float*>(P(e.inputs[2])) : nullptr;
      if (T(e.inputs[1]).type != dtype::f32 || (b && T(e.inputs[2]).type != dtype::f32)) {
        err = exec_error{exec_error_code::unsupported, where, "norm weights must be f32 (or constant, folded to f32)"};
        return nullptr;
      }
      const auto eps = static_cast<float>(e.attrs.eps);
      auto* y = reinterpret_cast<float*>(out);
      return [=]() -> std::optional<exec_error> {
        split_range(*pool_ptr, rows, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(N, 1)), 1, [&](std::int64_t f, std::int64_t l) {
          if (b) layer_norm(x + f * N, w, b, l - f, N, eps, y + f * N, lv);
          else rms_norm(x + f * N, w, l - f, N, eps, y + f * N, lv);
        });
        return std::nullopt;
      };
    }
    case op::rope: {
      const std::int64_t Tn = ot.dims[0], H = ot.dims[1], D = ot.dims[2];
      const auto* x = P(e.inputs[0]);
      const auto* pos = P(e.inputs[1]);
      const auto pos_type = T(e.inputs[1]).type;
      const auto* inv = reinterpret_cast<const float*>(P(e.inputs[2]));
      const std::int64_t half = T(e.inputs[2]).dims[0];
      const bool neox = e.attrs.neox;
      const auto scale = static_cast<float>(e.attrs.scale);
      std::vector<std::int32_t> p32(static_cast<std::size_t>(Tn));
      return [=]() mutable -> std::optional<exec_error> {
        for (std::int64_t t = 0; t < Tn; ++t) p32[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(load_any(pos_type, pos, t));
        split_range(*pool_ptr, Tn, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(H * D, 1)), 1, [&](std::int64_t f, std::int64_t l) {
          const std::size_t at = static_cast<std::size_t>(f * H * D) * sizeof(float);
          if (x != out) std::memcpy(out + at, x + at, static_cast<std::size_t>((l - f) * H * D) * sizeof(float));
          rope(reinterpret_cast<float*>(out + at), l - f, H, D, p32.data() + f, inv, half, neox, scale, lv);
        });
        return std::nullopt;
      };
    }
    default: break;
  }
  err = exec_error{exec_error_code::unsupported, where, "no CPU lowering"};
  return nullptr;
}

}  // namespace troupe::exec::cpu::lowering

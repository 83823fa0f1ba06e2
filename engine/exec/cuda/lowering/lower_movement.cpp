// Movement: reshape (an alias), transpose, slice, concat, broadcast.
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_movement(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::reshape:
      return std::nullopt;  // planned as an alias
    case op::transpose: case op::slice: case op::concat: case op::broadcast: {
      const auto es = static_cast<std::int32_t>(*storage_bytes(ot.type, 1));
      if (e.code == op::concat) {
        const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(ot.dims.rank()) : e.attrs.axis;
        std::int64_t outer = 1, inner = 1;
        for (std::int64_t d = 0; d < axis; ++d) outer *= ot.dims[static_cast<std::size_t>(d)];
        for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < ot.dims.rank(); ++d) inner *= ot.dims[d];
        const std::int64_t row = ot.dims[static_cast<std::size_t>(axis)] * inner;
        std::int64_t at = 0;
        for (auto v : e.inputs) {
          const std::int64_t len = T(v).dims[static_cast<std::size_t>(axis)] * inner;
          const auto* src = P(v);
          std::byte* dst = out + at * es;
          const std::size_t width = static_cast<std::size_t>(len * es), dpitch = static_cast<std::size_t>(row * es);
          if (width > 0 && outer > 0)
            en.program.push_back({[=, this]() -> std::optional<exec_error> {
              return check(cudaMemcpy2DAsync(dst, dpitch, src, width, width, static_cast<std::size_t>(outer), cudaMemcpyDeviceToDevice, st), where, true);
            }});
          at += len;
        }
        return std::nullopt;
      }
      const auto& it = T(e.inputs[0]);
      std::vector<std::int64_t> s;
      std::int64_t base = 0;
      if (e.code == op::transpose) {
        const auto in_st = dense_strides(it.dims);
        for (auto p : e.attrs.ints) s.push_back(in_st[static_cast<std::size_t>(p)]);
      } else if (e.code == op::slice) {
        const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(it.dims.rank()) : e.attrs.axis;
        s = dense_strides(it.dims);
        base = e.attrs.ints[0] * s[static_cast<std::size_t>(axis)];
      } else {
        s = broadcast_strides(it.dims, ot.dims);
      }
      auto m = map_of(ot.dims, {s});
      if (!m) return too_deep();
      m->base[0] = base;
      const auto* x = P(e.inputs[0]);
      return device([=, m = *m] { launch_copy_nd(es, x, m, out, st); });
    }
    default: break;
  }
  return exec_error{exec_error_code::unsupported, where, "no CUDA lowering"};
}

}  // namespace troupe::exec::cuda

// Movement: reshape (an alias), transpose, slice, concat, broadcast.
#include "engine/exec/cpu/lowering/lower.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::exec::cpu::lowering {

instr lower_movement(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::reshape:
      return nullptr;  // the same bytes (planned as an alias)
    case op::transpose: case op::slice: case op::concat: case op::broadcast: {
      // Movement: element copies through index arithmetic, by element size.
      const std::size_t es = *storage_bytes(ot.type, 1);
      const auto odims = ot.dims;
      if (e.code == op::concat) {
        const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(ot.dims.rank()) : e.attrs.axis;
        std::int64_t outer = 1, inner = 1;
        for (std::int64_t d = 0; d < axis; ++d) outer *= ot.dims[d];
        for (std::size_t d = axis + 1; d < ot.dims.rank(); ++d) inner *= ot.dims[d];
        std::vector<std::pair<const std::byte*, std::int64_t>> parts;
        for (auto v : e.inputs) parts.emplace_back(P(v), T(v).dims[axis] * inner);
        const std::int64_t row = ot.dims[axis] * inner;
        const std::int64_t grain = std::max<std::int64_t>(1, (64 << 10) / std::max<std::int64_t>(row * static_cast<std::int64_t>(es), 1));
        return [=]() -> std::optional<exec_error> {
          split_range(*pool_ptr, outer, grain, 1, [&](std::int64_t o0, std::int64_t o1) {
            for (std::int64_t o = o0; o < o1; ++o) {
              std::int64_t at = 0;
              for (const auto& [src, len] : parts) {
                std::memcpy(out + (o * row + at) * es, src + o * len * es, len * es);
                at += len;
              }
            }
          });
          return std::nullopt;
        };
      }
      const auto& it = T(e.inputs[0]);
      if (e.code == op::slice) {
        // A slice is `outer` runs of contiguous bytes: each row of the sliced axis and all inside it.
        const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(it.dims.rank()) : e.attrs.axis;
        std::int64_t outer = 1, inner = 1;
        for (std::int64_t d = 0; d < axis; ++d) outer *= it.dims[d];
        for (std::size_t d = axis + 1; d < it.dims.rank(); ++d) inner *= it.dims[d];
        const std::int64_t in_row = it.dims[axis] * inner * static_cast<std::int64_t>(es), out_row = ot.dims[axis] * inner * static_cast<std::int64_t>(es);
        const std::int64_t skip = e.attrs.ints[0] * inner * static_cast<std::int64_t>(es);
        const auto* x = P(e.inputs[0]);
        // Runs spread over the pool in ranges of at least 64 KiB (a decode step's slices stay on one thread).
        const std::int64_t grain = std::max<std::int64_t>(1, (64 << 10) / std::max<std::int64_t>(out_row, 1));
        return [=]() -> std::optional<exec_error> {
          split_range(*pool_ptr, outer, grain, 1, [&](std::int64_t o0, std::int64_t o1) {
            for (std::int64_t o = o0; o < o1; ++o) std::memcpy(out + o * out_row, x + o * in_row + skip, static_cast<std::size_t>(out_row));
          });
          return std::nullopt;
        };
      }
      std::vector<std::int64_t> st;
      const std::int64_t base = 0;
      if (e.code == op::transpose) {
        const auto in_st = dense_strides(it.dims);
        for (auto p : e.attrs.ints) st.push_back(in_st[p]);
      } else {
        st = broadcast_strides(it.dims, ot.dims);
      }
      const auto* x = P(e.inputs[0]);
      const std::array<std::vector<std::int64_t>, 1> strides = {st};
      return [=]() -> std::optional<exec_error> {
        for_each_broadcast<1>(odims, strides, [&](std::int64_t j, const std::array<std::int64_t, 1>& off) {
          std::memcpy(out + j * es, x + (base + off[0]) * es, es);
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

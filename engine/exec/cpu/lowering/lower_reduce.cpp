// Reductions along an axis: sums, max, mean, arg_max, softmax and log_softmax.
#include "engine/exec/cpu/lowering/lower.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::exec::cpu::lowering {

instr lower_reduce(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::reduce_sum: case op::reduce_max: case op::reduce_mean: case op::arg_max: case op::softmax: case op::log_softmax: {
      const auto& it = T(e.inputs[0]);
      const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(it.dims.rank()) : e.attrs.axis;
      std::int64_t outer = 1, len = it.dims[axis], inner = 1;
      for (std::int64_t d = 0; d < axis; ++d) outer *= it.dims[d];
      for (std::size_t d = axis + 1; d < it.dims.rank(); ++d) inner *= it.dims[d];
      const auto* x = P(e.inputs[0]);
      const auto code = e.code;
      const auto tin = it.type, tout = ot.type;
      if ((code == op::softmax || code == op::log_softmax) && inner == 1 && tin == dtype::f32)
        return [=]() -> std::optional<exec_error> {
          softmax_rows(reinterpret_cast<const float*>(x), outer, len, code == op::log_softmax, reinterpret_cast<float*>(out), lv);
          return std::nullopt;
        };
      // A sum (or mean) over a middle axis, as a routed feed-forward's k expert outputs per token: whole
      // rows of `inner` added in vectors, token ranges over the pool.
      if ((code == op::reduce_sum || code == op::reduce_mean) && inner > 1 && tin == dtype::f32 && tout == dtype::f32 && len > 0) {
        const auto* fx = reinterpret_cast<const float*>(x);
        auto* fy = reinterpret_cast<float*>(out);
        const float count = static_cast<float>(len);
        const std::int64_t grain = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(len * inner, 1));
        return [=]() -> std::optional<exec_error> {
          split_range(*pool_ptr, outer, grain, 1, [&](std::int64_t p0, std::int64_t p1) {
            for (std::int64_t p = p0; p < p1; ++p) {
              float* y = fy + p * inner;
              const float* xp = fx + p * len * inner;
              if (len == 1) std::memcpy(y, xp, static_cast<std::size_t>(inner) * sizeof(float));
              else binary(binary_kind::add, xp, false, xp + inner, false, inner, y, lv);
              for (std::int64_t j = 2; j < len; ++j) binary(binary_kind::add, y, false, xp + j * inner, false, inner, y, lv);
              if (code == op::reduce_mean) binary(binary_kind::div, y, false, &count, true, inner, y, lv);
            }
          });
          return std::nullopt;
        };
      }
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t p = 0; p < outer; ++p)
          for (std::int64_t k = 0; k < inner; ++k) {
            auto at = [&](std::int64_t j) { return load_any(tin, x, (p * len + j) * inner + k); };
            if (code == op::softmax || code == op::log_softmax) {
              double m = -INFINITY, s = 0;
              for (std::int64_t j = 0; j < len; ++j) m = std::max(m, at(j));
              for (std::int64_t j = 0; j < len; ++j) s += std::exp(at(j) - m);
              for (std::int64_t j = 0; j < len; ++j)
                store_element(tout, out, (p * len + j) * inner + k, code == op::log_softmax ? at(j) - m - std::log(s) : std::exp(at(j) - m) / s);
              continue;
            }
            double r = code == op::reduce_max ? at(0) : 0;
            std::int64_t best = 0;
            for (std::int64_t j = 0; j < len; ++j) {
              const double v = at(j);
              if (code == op::reduce_sum || code == op::reduce_mean) r += v;
              else if (code == op::reduce_max) r = std::isnan(r) || std::isnan(v) ? NAN : std::max(r, v);
              else if (j > 0 && !std::isnan(at(best)) && (std::isnan(v) || v > at(best))) best = j;
            }
            if (code == op::reduce_mean) r /= static_cast<double>(len);
            if (code == op::arg_max) r = static_cast<double>(best);
            store_element(tout, out, p * inner + k, r);
          }
        return std::nullopt;
      };
    }
    default: break;
  }
  err = exec_error{exec_error_code::unsupported, where, "no CPU lowering"};
  return nullptr;
}

}  // namespace troupe::exec::cpu::lowering

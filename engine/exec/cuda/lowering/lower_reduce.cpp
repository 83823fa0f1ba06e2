// Reductions along an axis: sums, max, mean, arg_max, softmax and log_softmax.
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_reduce(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::reduce_sum: case op::reduce_max: case op::reduce_mean: case op::arg_max: case op::softmax: case op::log_softmax: {
      const auto& it = T(e.inputs[0]);
      const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(it.dims.rank()) : e.attrs.axis;
      std::int64_t outer = 1, len = it.dims[static_cast<std::size_t>(axis)], inner = 1;
      for (std::int64_t d = 0; d < axis; ++d) outer *= it.dims[static_cast<std::size_t>(d)];
      for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < it.dims.rank(); ++d) inner *= it.dims[d];
      const ew k = e.code == op::reduce_sum ? ew::add : e.code == op::reduce_max ? ew::maximum : e.code == op::reduce_mean ? ew::div
                 : e.code == op::arg_max ? ew::greater : e.code == op::softmax ? ew::exp : ew::log;
      const auto* x = P(e.inputs[0]);
      const auto tin = it.type, tout = ot.type;
      return device([=] { launch_reduce(k, tin, tout, x, outer, len, inner, out, st); });
    }
    default: break;
  }
  return exec_error{exec_error_code::unsupported, where, "no CUDA lowering"};
}

}  // namespace troupe::exec::cuda

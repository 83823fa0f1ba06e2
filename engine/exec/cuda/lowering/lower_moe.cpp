// Routing: top_k, take_along and the expert-indexed linear_id.
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_moe(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::top_k: {
      const auto& xt = T(e.inputs[0]);
      if (xt.type != dtype::f32) return exec_error{exec_error_code::unsupported, where, "top_k over " + std::string(troupe::name(xt.type))};
      const std::int64_t E = xt.dims.back(), k = ot.dims.back(), rows = E ? xt.dims.numel() / E : 0;
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      return device([=] { launch_top_k(x, rows, E, k, reinterpret_cast<std::int32_t*>(out), st); });
    }
    case op::take_along: {
      const auto& xt = T(e.inputs[0]);
      const auto idx_type = T(e.inputs[1]).type;
      if (idx_type != dtype::i32 && idx_type != dtype::i64)
        return exec_error{exec_error_code::unsupported, where, "indices of type " + std::string(troupe::name(idx_type))};
      const std::int64_t E = xt.dims.back(), k = ot.dims.back(), rows = k ? n / k : 0;
      const auto es = static_cast<std::int32_t>(*storage_bytes(xt.type, 1));
      const auto* x = P(e.inputs[0]);
      const auto* idx = P(e.inputs[1]);
      return device([=] { launch_take_along(es, x, rows, E, idx_type, idx, k, out, flag, eqn, st); });
    }
    case op::linear_id: {
      const auto wv = e.inputs[1];
      const auto& wt = T(wv);
      auto stored = weight_type(en, wv, where);
      if (!stored) return stored.error();
      const dtype wtype = *stored;
      const auto id_type = T(e.inputs[2]).type;
      if (id_type != dtype::i32 && id_type != dtype::i64)
        return exec_error{exec_error_code::unsupported, where, "expert ids of type " + std::string(troupe::name(id_type))};
      const std::int64_t E = wt.dims[0], N = wt.dims[1], K = wt.dims[2];
      const auto& ids_t = T(e.inputs[2]);
      const std::int64_t P_ = ids_t.dims.numel(), picks = ids_t.dims.back();
      const bool x_per_pick = T(e.inputs[0]).dims.rank() == 3;
      auto idp = arena_.take(static_cast<std::size_t>(std::max<std::int64_t>(P_, 1)) * 4);
      if (!idp) return device_fault(where, idp.error());
      scratch_bytes_ += static_cast<std::size_t>(std::max<std::int64_t>(P_, 1)) * 4;
      auto* ids32 = reinterpret_cast<std::int32_t*>(*idp);
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* ids = P(e.inputs[2]);
      const std::byte* w = P(wv);
      return device([=] {
        launch_expert_ids(id_type, ids, P_, E, ids32, flag, eqn, st);
        launch_gemv_id(wtype, w, N, K, x, x_per_pick, picks, ids32, P_, reinterpret_cast<float*>(out), st);
      });
    }
    default: break;
  }
  return exec_error{exec_error_code::unsupported, where, "no CUDA lowering"};
}

}  // namespace troupe::exec::cuda

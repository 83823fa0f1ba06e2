// Products over weights: matmul, linear (cuBLASLt or the block-format GEMV) and the embedding lookup.
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_linear(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::matmul: {
      const auto& as = T(e.inputs[0]).dims;
      const auto& bs = T(e.inputs[1]).dims;
      const std::int64_t M = as[as.rank() - 2], K = as.back(), N = bs.back();
      const std::int64_t batch = n / std::max<std::int64_t>(M * N, 1);
      const auto* a = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* b = reinterpret_cast<const float*>(P(e.inputs[1]));
      return device([=] { launch_matmul_f32(a, b, batch, M, K, N, reinterpret_cast<float*>(out), st); });
    }
    case op::linear:
      return lower_linear(en, e, reinterpret_cast<float*>(out), nullptr, where);
    case op::gather_rows: {
      const auto& tt = T(e.inputs[0]);
      const auto* ids = P(e.inputs[1]);
      const auto id_type = T(e.inputs[1]).type;
      const std::int64_t count = T(e.inputs[1]).dims.numel(), R = tt.dims[0], C = tt.dims.rank() > 1 ? tt.dims.numel() / std::max<std::int64_t>(R, 1) : 1;
      auto idp = arena_.take(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * 4);
      if (!idp) return device_fault(where, idp.error());
      scratch_bytes_ += static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * 4;
      auto* ids32 = reinterpret_cast<std::int32_t*>(*idp);
      const auto* table = P(e.inputs[0]);
      // The table's stored type on the device (a weight may have been decoded to f16 at upload).
      dtype stored = tt.type;
      if (const auto b = std::find_if(g.weights().begin(), g.weights().end(), [&](const auto& w) { return w.value == e.inputs[0]; });
          b != g.weights().end() && !en.tp.pruned.folded.count(e.inputs[0].index))
        stored = exes_[en.exe.value]->uploaded.at(b->role.str()).type;
      if (id_type != dtype::i32 && id_type != dtype::i64)
        return exec_error{exec_error_code::unsupported, where, "ids of type " + std::string(troupe::name(id_type))};
      if (R == 0)  // every id is refused; nothing to read
        return device([=] { launch_check_ids(id_type, ids, count, R, ids32, flag, eqn, st); });
      if (ot.type == stored) {
        const std::int64_t row_bytes = static_cast<std::int64_t>(*storage_bytes(stored, static_cast<std::uint64_t>(C)));
        return device([=] {
          launch_check_ids(id_type, ids, count, R, ids32, flag, eqn, st);
          launch_gather_bytes(table, row_bytes, ids32, count, out, st);
        });
      }
      if (ot.type != dtype::f32 || !weight_format_supported(stored))
        return exec_error{exec_error_code::unsupported, where, "no CUDA gather from " + std::string(troupe::name(stored)) + " to " + std::string(troupe::name(ot.type))};
      return device([=] {
        launch_check_ids(id_type, ids, count, R, ids32, flag, eqn, st);
        launch_gather_decode(stored, table, C, ids32, count, reinterpret_cast<float*>(out), st);
      });
    }
    default: break;
  }
  return exec_error{exec_error_code::unsupported, where, "no CUDA lowering"};
}

}  // namespace troupe::exec::cuda

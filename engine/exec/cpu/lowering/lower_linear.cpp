// Products over weights: matmul, linear (packed, with the residual epilogue) and the embedding lookup.
#include "engine/exec/cpu/lowering/lower.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::exec::cpu::lowering {

namespace {

// The packed form of a linear's weight: the executable's (packed once per role, from the source), or
// the entry's own for a weight folded at prepare. Null, with c.err set, when it cannot be packed.
const packed_matrix* packed_weight(lower_ctx& c, const graph::equation& le) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  const auto wv = le.inputs[1];
  const auto& wt = T(wv);
  const packed_matrix* pm = nullptr;
  const auto wb = std::find_if(g.weights().begin(), g.weights().end(), [&](const auto& w) { return w.value == wv; });
  auto pack = [&](const tensor_view& view, bool stored = false) -> std::optional<packed_matrix> {
    auto pk = stored ? packed_matrix::pack(view, [&](const tensor_view& rows) { ex.weights->release(rows); }) : packed_matrix::pack(view);
    if (!pk) {
      err = exec_error{exec_error_code::unsupported, where, "cannot pack the weight: " + pk.error()};
      return std::nullopt;
    }
    return std::move(*pk);
  };
  // A mixture-of-experts router stored in a block format: its scores decide which experts a token runs,
  // and a near tie between two experts turns on the last bits of those scores. Its product with 8-bit
  // rounded activations (what every other block-format linear runs) would move them by up to a few
  // thousandths, so the router is decoded once to f32 (its rows are E x H, a small share of a routed
  // model) and takes the activations unrounded: the scores are the stored router's, to f32 rounding.
  // A form without a row decoder keeps its own packing.
  auto router_exactly = [&](const tensor_view& stored) -> std::optional<packed_matrix> {
    auto pk = packed_matrix::pack_decoded(stored, dtype::f32, [&](const tensor_view& rows) { ex.weights->release(rows); });
    return pk ? std::optional<packed_matrix>(std::move(*pk)) : pack(stored, true);
  };
  if (wb != g.weights().end()) {
    const auto key = wb->role.str();
    auto it = ex.packed.find(key);
    if (it == ex.packed.end()) {
      const auto stored = *ex.weights->find(wb->role);
      auto pk = wb->role.kind == graph::tensor_role::ffn_gate_inp && is_quantized(stored.type()) ? router_exactly(stored) : pack(stored, true);
      if (!pk) return nullptr;
      it = ex.packed.emplace(key, std::move(*pk)).first;
    }
    pm = &it->second;
  } else if (en.tp.pruned.constant[wv.index]) {
    auto pk = pack(tensor_view(wt.type, wt.dims, P(wv)));
    if (!pk) return nullptr;
    en.own_packed.push_back(std::move(*pk));
    pm = &en.own_packed.back();
  } else {
    err = exec_error{exec_error_code::unsupported, where, "a linear weight must be known at prepare"};
    return nullptr;
  }
  return pm;
}

}  // namespace

bool linear_siblings(const graph::graph& g, const graph::equation& a, const graph::equation& b) {
  if (a.code != op::linear || b.code != op::linear || a.inputs.size() != 2 || b.inputs.size() != 2) return false;
  if (a.inputs[0] != b.inputs[0]) return false;
  const auto& wa = g.info(a.inputs[1]).type;
  const auto& wb = g.info(b.inputs[1]).type;
  return wa.dims.rank() == 2 && wb.dims.rank() == 2 && wa.dims[1] == wb.dims[1] &&
         g.info(a.out).type.type == dtype::f32 && g.info(b.out).type.type == dtype::f32;
}

instr lower_linear_group(lower_ctx& c, std::span<const std::size_t> eqns) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  std::vector<matmul_job> jobs;
  for (const std::size_t k : eqns) {
    const auto& le = g.equations()[k];
    const packed_matrix* pm = packed_weight(c, le);
    if (!pm) return nullptr;
    const std::int64_t K = pm->cols(), N = pm->rows();
    const std::int64_t M = K == 0 ? 0 : T(le.inputs[0]).dims.numel() / K;
    jobs.push_back({pm, reinterpret_cast<const float*>(P(le.inputs[0])), K, M, reinterpret_cast<float*>(P(le.out)), N});
  }
  // One batch per packed format (a k-quant file may store v in another format than q and k).
  std::stable_sort(jobs.begin(), jobs.end(), [](const matmul_job& a, const matmul_job& b) { return a.w->type() < b.w->type(); });
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (runs.empty() || jobs[runs.back().first].w->type() != jobs[j].w->type()) runs.push_back({j, 0});
    ++runs.back().second;
  }
  return [=]() -> std::optional<exec_error> {
    for (const auto& [first, count] : runs) matmul_batch(std::span(jobs).subspan(first, count), *pool_ptr, lv);
    return std::nullopt;
  };
}

instr lower_linear_into(lower_ctx& c, const graph::equation& le, float* y, const float* r) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  const auto& wt = T(le.inputs[1]);
  const packed_matrix* pm = packed_weight(c, le);
  if (!pm) return nullptr;
  const std::int64_t K = wt.dims[1], N = wt.dims[0];
  const std::int64_t M = K == 0 ? 0 : T(le.inputs[0]).dims.numel() / K;
  const auto* x = reinterpret_cast<const float*>(P(le.inputs[0]));
  return [=]() -> std::optional<exec_error> {
    matmul(*pm, x, K, M, y, N, *pool_ptr, lv, r, N);
    return std::nullopt;
  };
}

instr lower_linear(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  auto lower_linear = [&c](const graph::equation& le, float* y, const float* r) { return lower_linear_into(c, le, y, r); };
  switch (e.code) {
    case op::matmul: {
      const auto& as = T(e.inputs[0]).dims;
      const auto& bs = T(e.inputs[1]).dims;
      const std::int64_t M = as[as.rank() - 2], K = as.back(), N = bs.back();
      const std::int64_t batch = n / std::max<std::int64_t>(M * N, 1);
      const auto* a = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* b = reinterpret_cast<const float*>(P(e.inputs[1]));
      auto* y = reinterpret_cast<float*>(out);
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t z = 0; z < batch; ++z)
          for (std::int64_t r = 0; r < M; ++r)
            for (std::int64_t c = 0; c < N; ++c) {
              float s = 0;
              for (std::int64_t k = 0; k < K; ++k) s += a[(z * M + r) * K + k] * b[(z * K + k) * N + c];
              y[(z * M + r) * N + c] = s;
            }
        return std::nullopt;
      };
    }
    case op::linear:
      return lower_linear(e, reinterpret_cast<float*>(out), nullptr);
    case op::gather_rows: {
      const auto& tt = T(e.inputs[0]);
      const tensor_view table(tt.type, tt.dims, P(e.inputs[0]));
      const auto* ids = P(e.inputs[1]);
      const auto id_type = T(e.inputs[1]).type;
      const std::int64_t count = T(e.inputs[1]).dims.numel(), R = tt.dims[0];
      const std::size_t row_bytes = table.row_bytes();
      const bool plain = ot.type == tt.type;
      std::vector<std::int32_t> scratch(static_cast<std::size_t>(count));
      return [=]() mutable -> std::optional<exec_error> {
        for (std::int64_t j = 0; j < count; ++j) {
          const double id = load_any(id_type, ids, j);
          if (id < 0 || id >= static_cast<double>(R))
            return fail(exec_error_code::index_out_of_range, where, "row " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(R) + ")");
          scratch[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(id);
        }
        if (plain) {
          for (std::int64_t j = 0; j < count; ++j) std::memcpy(out + j * row_bytes, table.data() + scratch[j] * row_bytes, row_bytes);
        } else {
          cpu::gather_rows(table, scratch.data(), count, reinterpret_cast<float*>(out));
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

// Routing: top_k, take_along and the expert-indexed linear_id (tokens grouped by expert).
#include "engine/exec/cpu/lowering/lower.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

namespace troupe::exec::cpu::lowering {

namespace {
// The gathered rows of the expert products and their outputs: grow-only buffers of the step's thread,
// shared by every linear_id of every entry (a step's instructions run one after another on its
// thread). A buffer per instruction held 20 MB per expert product of a 1024-token Qwen3-Next-shaped
// prefill entry, each faulted in and zeroed on its first step: 56% of that step's time.
float* expert_scratch(int slot, std::int64_t floats) {
  thread_local std::array<std::unique_ptr<float[]>, 2> buf;
  thread_local std::array<std::int64_t, 2> cap{};
  const auto s = static_cast<std::size_t>(slot);
  if (floats > cap[s]) {
    buf[s].reset(new float[static_cast<std::size_t>(floats)]);  // not zeroed: every float is written before it is read
    cap[s] = floats;
  }
  return buf[s].get();
}
}  // namespace

instr lower_moe(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::top_k: {
      const auto& xd = T(e.inputs[0]).dims;
      const std::int64_t E = xd.back(), rows = E == 0 ? 0 : xd.numel() / E, k = e.attrs.ints[0];
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      auto* y = reinterpret_cast<std::int32_t*>(out);
      std::vector<std::int32_t> order(static_cast<std::size_t>(E));
      return [=]() mutable -> std::optional<exec_error> {
        for (std::int64_t r = 0; r < rows; ++r) {
          const float* xr = x + r * E;
          for (std::int64_t j = 0; j < E; ++j) order[j] = static_cast<std::int32_t>(j);
          std::partial_sort(order.begin(), order.begin() + k, order.end(),
                            [xr](std::int32_t i, std::int32_t j) { return graph::top_k_before(xr[i], i, xr[j], j); });
          std::copy_n(order.begin(), k, y + r * k);
        }
        return std::nullopt;
      };
    }
    case op::take_along: {
      const auto& xt = T(e.inputs[0]);
      const std::int64_t E = xt.dims.back(), k = ot.dims.back(), rows = k == 0 ? 0 : n / k;
      const std::size_t es = info(xt.type).block_bytes;
      const auto* x = P(e.inputs[0]);
      const auto* ix = P(e.inputs[1]);
      const auto ix_type = T(e.inputs[1]).type;
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < k; ++j) {
            const double id = load_any(ix_type, ix, r * k + j);
            if (id < 0 || id >= static_cast<double>(E))
              return fail(exec_error_code::index_out_of_range, where, "index " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(E) + ")");
            std::memcpy(out + (r * k + j) * es, x + (r * E + static_cast<std::int64_t>(id)) * es, es);
          }
        return std::nullopt;
      };
    }
    case op::linear_id: {
      const std::size_t one[] = {i};
      return lower_linear_id_group(c, one);
    }
    default: break;
  }
  err = exec_error{exec_error_code::unsupported, where, "no CPU lowering"};
  return nullptr;
}

bool linear_id_siblings(const graph::graph& g, const graph::equation& a, const graph::equation& b) {
  if (a.code != op::linear_id || b.code != op::linear_id || a.inputs.size() != 3 || b.inputs.size() != 3) return false;
  if (a.inputs[0] != b.inputs[0] || a.inputs[2] != b.inputs[2]) return false;
  const auto& wa = g.info(a.inputs[1]).type;
  const auto& wb = g.info(b.inputs[1]).type;
  // One stored type: matmul_batch runs one format's kernel (a k-quant file may store gate and up apart).
  return wa.type == wb.type && wa.dims.rank() == 3 && wb.dims.rank() == 3 && wa.dims[0] == wb.dims[0] && wa.dims[2] == wb.dims[2] &&
         g.info(a.out).type.type == dtype::f32 && g.info(b.out).type.type == dtype::f32;
}

instr lower_linear_id_group(lower_ctx& c, std::span<const std::size_t> eqns) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  // Each member's experts: every expert's [N, K] matrix packed on its own, from its bytes in the stored
  // tensor (once per executable), and where the member writes.
  struct member {
    const std::vector<packed_matrix>* mats;
    std::int64_t N;
    float* y;
  };
  std::vector<member> members;
  for (const std::size_t q : eqns) {
    const auto& qe = g.equations()[q];
    const auto wv = qe.inputs[1];
    const auto& wt = T(wv);
    const auto wb = std::find_if(g.weights().begin(), g.weights().end(), [&](const auto& w) { return w.value == wv; });
    if (wb == g.weights().end()) {
      err = exec_error{exec_error_code::unsupported, where, "an expert weight must be a stored weight"};
      return nullptr;
    }
    const std::int64_t E = wt.dims[0], N = wt.dims[1], K = wt.dims[2];
    const auto key = wb->role.str();
    auto it = ex.experts.find(key);
    if (it == ex.experts.end()) {
      const auto full = *ex.weights->find(wb->role);
      const auto per = *storage_bytes(wt.type, static_cast<std::uint64_t>(N * K));
      std::vector<packed_matrix> mats;
      mats.reserve(static_cast<std::size_t>(E));
      for (std::int64_t x = 0; x < E; ++x) {
        auto pk = packed_matrix::pack(tensor_view(wt.type, troupe::shape{N, K}, full.data() + static_cast<std::size_t>(x) * per),
                                      [&](const tensor_view& rows) { ex.weights->release(rows); });
        if (!pk) {
          err = exec_error{exec_error_code::unsupported, where, "cannot pack expert " + std::to_string(x) + ": " + pk.error()};
          return nullptr;
        }
        mats.push_back(std::move(*pk));
      }
      it = ex.experts.emplace(key, std::move(mats)).first;
    }
    members.push_back({&it->second, N, reinterpret_cast<float*>(P(qe.out))});
  }
  const auto& wt0 = T(e.inputs[1]);
  const std::int64_t E = wt0.dims[0], K = wt0.dims[2];
  const std::int64_t Tn = ot.dims[0], k = ot.dims[1];
  std::int64_t sumN = 0;
  for (const auto& mb : members) sumN += mb.N;
  const bool shared = T(e.inputs[0]).dims.rank() == 2;
  const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
  const auto* ids = P(e.inputs[2]);
  const auto id_type = T(e.inputs[2]).type;
  // Picks grouped by expert: each selected expert runs one product over all its tokens, so a prefill
  // reads each expert's weights once and a decode reads only the selected experts'. Siblings (a
  // layer's gate and up over the same x and picks) share the grouping, the gathered rows and one
  // dispatch: one preparation of each row and one end-of-dispatch wait instead of one per member.
  std::vector<std::int32_t> chosen(static_cast<std::size_t>(Tn * k));
  std::vector<std::int64_t> start(static_cast<std::size_t>(E + 1)), fill(static_cast<std::size_t>(E)), order(static_cast<std::size_t>(Tn * k));
  std::vector<matmul_job> jobs;
  return [=]() mutable -> std::optional<exec_error> {
    std::fill(start.begin(), start.end(), 0);
    for (std::int64_t p = 0; p < Tn * k; ++p) {
      const double id = load_any(id_type, ids, p);
      if (id >= static_cast<double>(E))
        return fail(exec_error_code::index_out_of_range, where, "expert " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(E) + ")");
      chosen[p] = id < 0 ? -1 : static_cast<std::int32_t>(id);
      if (chosen[p] < 0) {
        for (const auto& mb : members) std::fill_n(mb.y + p * mb.N, mb.N, 0.0f);  // another rank's expert
        continue;
      }
      ++start[chosen[p] + 1];
    }
    for (std::int64_t x2 = 0; x2 < E; ++x2) start[x2 + 1] += start[x2];
    std::copy(start.begin(), start.end() - 1, fill.begin());
    for (std::int64_t p = 0; p < Tn * k; ++p)
      if (chosen[p] >= 0) order[fill[chosen[p]]++] = p;
    // One product per selected expert and member, all in one dispatch. A lone pick (decode) reads its
    // row in place and writes its output directly; an expert with several gathers them first.
    std::int64_t gathered = 0;
    for (std::int64_t x2 = 0; x2 < E; ++x2)
      if (start[x2 + 1] - start[x2] > 1) gathered += start[x2 + 1] - start[x2];
    float* xs = expert_scratch(0, gathered * K);
    float* ys = expert_scratch(1, gathered * sumN);
    jobs.clear();
    std::int64_t at = 0;
    for (std::int64_t x2 = 0; x2 < E; ++x2) {
      const std::int64_t m = start[x2 + 1] - start[x2];
      if (m == 0) continue;
      const std::int64_t* picks = order.data() + start[x2];
      if (m == 1) {
        const std::int64_t p = picks[0];
        for (const auto& mb : members) jobs.push_back({&(*mb.mats)[x2], x + (shared ? p / k : p) * K, K, 1, mb.y + p * mb.N, mb.N});
        continue;
      }
      for (std::int64_t r = 0; r < m; ++r)
        std::memcpy(xs + (at + r) * K, x + (shared ? picks[r] / k : picks[r]) * K, K * sizeof(float));
      std::int64_t col = 0;  // the member's columns within a gathered output row of sumN
      for (const auto& mb : members) {
        jobs.push_back({&(*mb.mats)[x2], xs + at * K, K, m, ys + at * sumN + col, sumN});
        col += mb.N;
      }
      at += m;
    }
    matmul_batch(jobs, *pool_ptr, lv);
    at = 0;
    for (std::int64_t x2 = 0; x2 < E; ++x2) {
      const std::int64_t m = start[x2 + 1] - start[x2];
      if (m <= 1) continue;
      const std::int64_t* picks = order.data() + start[x2];
      for (std::int64_t r = 0; r < m; ++r) {
        std::int64_t col = 0;
        for (const auto& mb : members) {
          std::memcpy(mb.y + picks[r] * mb.N, ys + (at + r) * sumN + col, mb.N * sizeof(float));
          col += mb.N;
        }
      }
      at += m;
    }
    return std::nullopt;
  };
}

}  // namespace troupe::exec::cpu::lowering

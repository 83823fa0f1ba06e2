#pragma once
// The CUDA target's mixture-of-experts routing, per thread: top_k over a row, the check of an expert
// id, and the attention sink's share of a softmax. Plain C++ both compilers build (hd.hpp): the
// kernels in kernels.cu and linear_kernels.cu call these, and the host tests run the same code against
// the oracle's meaning (engine/graph/ops.hpp).
#include <cmath>
#include <cstdint>

#include "engine/exec/cuda/hd.hpp"
#include "engine/graph/top_k_order.hpp"

namespace troupe::exec::cuda {

// out[0..k) = the indices of row x[0..E)'s k first elements in top_k's order (graph::top_k_before),
// first first. Selection without scratch: pick j is the first element ranked after pick j - 1, so a
// row costs E x k comparisons (E is an expert count; k a handful).
template <class T>
TROUPE_HD void top_k_row(const T* x, std::int64_t E, std::int64_t k, std::int32_t* out) {
  std::int64_t prev = -1;
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t best = -1;
    for (std::int64_t e = 0; e < E; ++e) {
      if (prev >= 0 && !graph::top_k_before(x[prev], prev, x[e], e)) continue;  // already picked
      if (best < 0 || graph::top_k_before(x[e], e, x[best], best)) best = e;
    }
    out[j] = static_cast<std::int32_t>(best);
    prev = best;
  }
}

// An expert id of linear_id as the GEMV reads it: a negative id (another rank's expert) selects
// nothing (-1, zeros); an id at or past E is refused (`bad`) and reads nothing either.
TROUPE_HD std::int32_t expert_of(std::int64_t id, std::int64_t E, bool& bad) {
  bad = id >= E;
  return id < 0 || id >= E ? -1 : static_cast<std::int32_t>(id);
}

// The end of an online softmax with an attention sink: (m, l) are the running max and sum of the
// scores' exponentials; the sink is a logit in the denominator that no value answers. Returns the
// factor the running output is multiplied by (acc * factor is the attention output); 0 when no key
// was allowed. As the oracle: the sink joins the max before the sum.
TROUPE_HD float sink_factor(float m, float l, float sink) {
  if (m == -INFINITY || l <= 0.0f) return 0.0f;
  const float m2 = m > sink ? m : sink;
  const float scale = expf(m - m2);
  return scale / (l * scale + expf(sink - m2));
}

// Split-K decode attention (flash-decoding): one query's softmax computed over disjoint key ranges,
// each range leaving [max, sum, acc[Dv]] at part + s * stride (max -inf: no allowed key in it). The
// merge: M the largest max (and the sink's logit, when `sink` is given), L = sum_s e^(m_s - M) l_s
// (+ e^(sink - M)); the output is sum_s e^(m_s - M) acc_s / L. Returns 1 / L and sets M; 0 when no
// range had an allowed key (the output is zeros, as the op says).
TROUPE_HD float merge_splits_norm(const float* part, int splits, std::int64_t stride, const float* sink, float& M) {
  M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = part[s * stride] > M ? part[s * stride] : M;
  if (M == -INFINITY) return 0.0f;
  if (sink != nullptr) M = *sink > M ? *sink : M;
  float L = sink != nullptr ? expf(*sink - M) : 0.0f;
  for (int s = 0; s < splits; ++s)
    if (part[s * stride] != -INFINITY) L += expf(part[s * stride] - M) * part[s * stride + 1];
  return L > 0.0f ? 1.0f / L : 0.0f;
}
// Value dimension d of the merged output before the 1 / L: sum_s e^(m_s - M) acc_s[d].
TROUPE_HD float merge_splits_value(const float* part, int splits, std::int64_t stride, float M, std::int64_t d) {
  float v = 0.0f;
  for (int s = 0; s < splits; ++s)
    if (part[s * stride] != -INFINITY) v += expf(part[s * stride] - M) * part[s * stride + 2 + d];
  return v;
}

}  // namespace troupe::exec::cuda

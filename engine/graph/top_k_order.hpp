#pragma once
// top_k's order, its one definition for every target (the oracle, the CPU executor and, through
// nvcc's relaxed constexpr, the CUDA kernels): a header of its own so device code can include it
// without the rest of the graph IR.
#include <cstdint>

namespace troupe::graph {

// Does element (u at index i) rank before (v at index j)? Larger first, NaN below every number, equal
// values (and NaNs) by the lower index.
template <class T>
constexpr bool top_k_before(T u, std::int64_t i, T v, std::int64_t j) {
  const bool nu = u != u, nv = v != v;  // NaN
  if (nu != nv) return nv;
  return nu ? i < j : u > v || (u == v && i < j);
}

}  // namespace troupe::graph

#pragma once
// Log-softmax of a logits row in double: what the comparison tests measure log-probabilities with.
#include <algorithm>
#include <cmath>
#include <vector>

namespace troupe::testing {

inline std::vector<double> log_softmax(const std::vector<float>& logits) {
  double m = -INFINITY, s = 0;
  for (float v : logits) m = std::max(m, static_cast<double>(v));
  for (float v : logits) s += std::exp(v - m);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - m - std::log(s);
  return out;
}

}  // namespace troupe::testing

#include "families/components/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace troupe::families {

rope_table make_rope_table(const rope_config& c, std::int64_t capacity) {
  const std::int64_t half = c.dims / 2;
  const double d = static_cast<double>(c.dims);
  double base = c.theta;
  if (c.kind == rope_kind::dynamic && c.original_max_positions > 0 && capacity > c.original_max_positions) {
    const double r = c.factor * static_cast<double>(capacity) / static_cast<double>(c.original_max_positions) - (c.factor - 1.0);
    base = c.theta * std::pow(r, d / (d - 2.0));
  }
  std::vector<double> inv(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(base, 2.0 * static_cast<double>(i) / d);

  rope_table t;
  switch (c.kind) {
    case rope_kind::none:
    case rope_kind::dynamic:
      break;
    case rope_kind::linear:
      for (auto& f : inv) f /= c.factor;
      break;
    case rope_kind::yarn: {
      const double max_pos = static_cast<double>(c.original_max_positions);
      auto correction_dim = [&](double rotations) {
        return d * std::log(max_pos / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
      };
      double low = std::max(0.0, std::floor(correction_dim(c.beta_fast)));
      double high = std::min(d - 1.0, std::ceil(correction_dim(c.beta_slow)));
      if (low == high) high += 0.001;
      for (std::int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolate = 1.0 - ramp;
        inv[i] = inv[i] / c.factor * (1.0 - extrapolate) + inv[i] * extrapolate;
      }
      t.scale = c.attention_factor > 0 ? c.attention_factor : (c.factor > 1.0 ? 0.1 * std::log(c.factor) + 1.0 : 1.0);
      break;
    }
    case rope_kind::llama3: {
      const double old = static_cast<double>(c.original_max_positions);
      const double low_wavelen = old / c.low_freq_factor, high_wavelen = old / c.high_freq_factor;
      for (auto& f : inv) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f /= c.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (old / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
          f = (1.0 - smooth) * f / c.factor + smooth * f;
        }
      }
      break;
    }
    case rope_kind::longrope: {
      const bool extended = capacity > c.original_max_positions;
      const auto& ext = extended ? c.long_factor : c.short_factor;
      for (std::size_t i = 0; i < inv.size() && i < ext.size(); ++i) inv[i] /= ext[i];
      t.scale = c.attention_factor > 0 ? c.attention_factor
                : c.factor > 1.0 && c.original_max_positions > 1
                    ? std::sqrt(1.0 + std::log(c.factor) / std::log(static_cast<double>(c.original_max_positions)))
                    : 1.0;
      break;
    }
  }
  t.inv_freq.assign(inv.begin(), inv.end());
  return t;
}

}  // namespace troupe::families

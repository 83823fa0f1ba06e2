#pragma once
// A tensor's static shape: up to eight dimensions, outermost first (row-major, as PyTorch lists them).
// Element counts are checked: a product that overflows int64 is reported, never wrapped.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>

namespace troupe {

class shape {
 public:
  static constexpr std::size_t max_rank = 8;

  shape() = default;
  shape(std::initializer_list<std::int64_t> dims);
  explicit shape(std::span<const std::int64_t> dims);

  std::size_t rank() const { return rank_; }
  std::int64_t operator[](std::size_t i) const { return dims_[i]; }
  std::int64_t& operator[](std::size_t i) { return dims_[i]; }
  std::int64_t back() const { return dims_[rank_ - 1]; }
  std::span<const std::int64_t> dims() const { return {dims_.data(), rank_}; }

  // Element count; nullopt on overflow or a negative dimension.
  std::optional<std::int64_t> checked_numel() const;
  // Element count of a shape already known valid (a verified graph value, a loaded tensor).
  std::int64_t numel() const;

  shape with_back(std::int64_t d) const;
  std::string str() const;  // "[4, 512]"

  friend bool operator==(const shape& a, const shape& b);

 private:
  std::array<std::int64_t, max_rank> dims_{};
  std::size_t rank_ = 0;
};

}  // namespace troupe

#include "engine/core/shape.hpp"

#include <stdexcept>

namespace troupe {

shape::shape(std::initializer_list<std::int64_t> dims) : shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

shape::shape(std::span<const std::int64_t> dims) {
  // Rank past max_rank is a programming error of the caller; readers of outside bytes check the rank
  // before building a shape.
  if (dims.size() > max_rank) throw std::length_error("troupe::shape: rank above 8");
  rank_ = dims.size();
  for (std::size_t i = 0; i < rank_; ++i) dims_[i] = dims[i];
}

std::optional<std::int64_t> shape::checked_numel() const {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < rank_; ++i) {
    if (dims_[i] < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, dims_[i], &n)) return std::nullopt;
  }
  return n;
}

std::int64_t shape::numel() const {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

shape shape::with_back(std::int64_t d) const {
  shape s = *this;
  s.dims_[rank_ - 1] = d;
  return s;
}

std::string shape::str() const {
  std::string s = "[";
  for (std::size_t i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

bool operator==(const shape& a, const shape& b) {
  if (a.rank_ != b.rank_) return false;
  for (std::size_t i = 0; i < a.rank_; ++i)
    if (a.dims_[i] != b.dims_[i]) return false;
  return true;
}

}  // namespace troupe

#pragma once
// Host tensors: `tensor_view` borrows bytes (a mapped checkpoint, a buffer someone else owns) and
// `tensor` owns a 64-byte aligned buffer. Both are dense and row-major; a block-quantized tensor is a
// sequence of blocks along its last dimension, which must be a whole number of blocks.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "engine/core/dtype.hpp"
#include "engine/core/shape.hpp"

namespace troupe {

class tensor_view {
 public:
  tensor_view() = default;
  tensor_view(dtype t, troupe::shape s, const std::byte* data);

  dtype type() const { return type_; }
  const troupe::shape& shape() const { return shape_; }
  const std::byte* data() const { return data_; }
  std::size_t bytes() const;
  std::int64_t numel() const { return shape_.numel(); }
  // Bytes of one row along the last dimension.
  std::size_t row_bytes() const;
  std::span<const std::byte> byte_span() const { return {data_, bytes()}; }
  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(data_); }

 private:
  dtype type_ = dtype::f32;
  troupe::shape shape_;
  const std::byte* data_ = nullptr;
};

class tensor {
 public:
  tensor() = default;
  // Zero-filled storage for `s` in `t`; `s` must be valid for `t` (see storage_bytes).
  tensor(dtype t, troupe::shape s);
  tensor(const tensor&);
  tensor& operator=(const tensor&);
  tensor(tensor&&) noexcept = default;
  tensor& operator=(tensor&&) noexcept = default;

  static tensor copy_of(const tensor_view& v);

  dtype type() const { return type_; }
  const troupe::shape& shape() const { return shape_; }
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  std::size_t bytes() const { return bytes_; }
  std::int64_t numel() const { return shape_.numel(); }
  tensor_view view() const { return {type_, shape_, data_.get()}; }
  template <class T>
  T* as() { return reinterpret_cast<T*>(data_.get()); }
  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(data_.get()); }
  // Same bytes, another shape of the same element count.
  tensor reshaped(troupe::shape s) &&;

 private:
  struct free_aligned {
    void operator()(std::byte* p) const;
  };
  dtype type_ = dtype::f32;
  troupe::shape shape_;
  std::size_t bytes_ = 0;
  std::unique_ptr<std::byte[], free_aligned> data_;
};

// Element access for plain types, through double (exact for every plain type troupe stores).
double load_element(dtype t, const std::byte* base, std::int64_t index);
void store_element(dtype t, std::byte* base, std::int64_t index, double value);

}  // namespace troupe

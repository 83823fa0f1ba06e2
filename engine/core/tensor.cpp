#include "engine/core/tensor.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>

#include <sys/mman.h>

#include "engine/core/half.hpp"

namespace troupe {

namespace {

// Tensor storage is 64-byte aligned and zero-filled. Small blocks come from aligned_alloc and are
// cleared; a block of 128 KiB or more is an anonymous mapping, zero by construction and backed by memory
// only where it is written, so a KV pool or an activation arena sized for the longest case costs what
// is used of it, and a freed one goes back at once (a loader's converted tensors of a few hundred KiB,
// freed in turn in glibc's heap, left about 10 MB resident there through the load). Each block starts 64 bytes before the data with its size and origin, which the
// deleter reads back.
constexpr std::size_t header = 64, map_threshold = std::size_t{1} << 17;
struct block_header {
  std::size_t bytes;  // the whole block, header included
  bool mapped;
};

std::byte* allocate_zeroed(std::size_t alloc) {
  const std::size_t total = alloc + header;
  void* base = nullptr;
  const bool mapped = total >= map_threshold;
  if (mapped) {
    base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc();
  } else {
    base = std::aligned_alloc(64, total);
    if (!base) throw std::bad_alloc();
    std::memset(base, 0, total);
  }
  auto* h = static_cast<block_header*>(base);
  h->bytes = total;
  h->mapped = mapped;
  return static_cast<std::byte*>(base) + header;
}

}  // namespace

tensor_view::tensor_view(dtype t, troupe::shape s, const std::byte* data) : type_(t), shape_(s), data_(data) {}

std::size_t tensor_view::bytes() const { return *storage_bytes(type_, static_cast<std::uint64_t>(shape_.numel())); }

std::size_t tensor_view::row_bytes() const {
  if (shape_.rank() == 0) return bytes();
  return *storage_bytes(type_, static_cast<std::uint64_t>(shape_.back()));
}

void tensor::free_aligned::operator()(std::byte* p) const {
  if (!p) return;
  std::byte* base = p - header;
  const auto* h = reinterpret_cast<const block_header*>(base);
  if (h->mapped) ::munmap(base, h->bytes);
  else std::free(base);
}

tensor::tensor(dtype t, troupe::shape s) : type_(t), shape_(s) {
  const auto n = s.checked_numel();
  const auto b = n ? storage_bytes(t, static_cast<std::uint64_t>(*n)) : std::nullopt;
  if (!b) throw std::invalid_argument("troupe::tensor: shape " + s.str() + " invalid for " + std::string(name(t)));
  bytes_ = *b;
  const std::size_t alloc = (bytes_ + 63) / 64 * 64;
  data_.reset(allocate_zeroed(alloc == 0 ? 64 : alloc));
}

tensor::tensor(const tensor& o) : tensor(o.type_, o.shape_) { std::memcpy(data(), o.data(), bytes_); }

tensor& tensor::operator=(const tensor& o) {
  if (this != &o) *this = tensor(o);
  return *this;
}

tensor tensor::copy_of(const tensor_view& v) {
  tensor t(v.type(), v.shape());
  if (t.bytes_) std::memcpy(t.data(), v.data(), t.bytes_);
  return t;
}

tensor tensor::reshaped(troupe::shape s) && {
  if (s.numel() != shape_.numel()) throw std::invalid_argument("troupe::tensor::reshaped: element count differs");
  tensor t = std::move(*this);
  t.shape_ = s;
  return t;
}

double load_element(dtype t, const std::byte* base, std::int64_t i) {
  switch (t) {
    case dtype::f64: { double v; std::memcpy(&v, base + i * 8, 8); return v; }
    case dtype::f32: { float v; std::memcpy(&v, base + i * 4, 4); return v; }
    case dtype::f16: { std::uint16_t v; std::memcpy(&v, base + i * 2, 2); return f16_to_f32(v); }
    case dtype::bf16: { std::uint16_t v; std::memcpy(&v, base + i * 2, 2); return bf16_to_f32(v); }
    case dtype::fp8_e4m3: return fp8_e4m3_to_f32(static_cast<std::uint8_t>(base[i]));
    case dtype::fp8_e5m2: return fp8_e5m2_to_f32(static_cast<std::uint8_t>(base[i]));
    case dtype::i64: { std::int64_t v; std::memcpy(&v, base + i * 8, 8); return static_cast<double>(v); }
    case dtype::i32: { std::int32_t v; std::memcpy(&v, base + i * 4, 4); return v; }
    case dtype::i16: { std::int16_t v; std::memcpy(&v, base + i * 2, 2); return v; }
    case dtype::i8: return static_cast<std::int8_t>(base[i]);
    case dtype::u8: return static_cast<std::uint8_t>(base[i]);
    case dtype::boolean: return base[i] != std::byte{0} ? 1.0 : 0.0;
    default: throw std::invalid_argument("troupe::load_element: block type " + std::string(name(t)));
  }
}

namespace {
template <class I>
I saturate(double v) {
  if (std::isnan(v)) return 0;
  const double r = std::nearbyint(v);
  if (r <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (r >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(r);
}
}  // namespace

void store_element(dtype t, std::byte* base, std::int64_t i, double v) {
  switch (t) {
    case dtype::f64: std::memcpy(base + i * 8, &v, 8); return;
    case dtype::f32: { const float f = static_cast<float>(v); std::memcpy(base + i * 4, &f, 4); return; }
    case dtype::f16: { const auto h = f32_to_f16(static_cast<float>(v)); std::memcpy(base + i * 2, &h, 2); return; }
    case dtype::bf16: { const auto h = f32_to_bf16(static_cast<float>(v)); std::memcpy(base + i * 2, &h, 2); return; }
    case dtype::fp8_e4m3: base[i] = std::byte{f32_to_fp8_e4m3(static_cast<float>(v))}; return;
    case dtype::fp8_e5m2: base[i] = std::byte{f32_to_fp8_e5m2(static_cast<float>(v))}; return;
    case dtype::i64: { const auto x = saturate<std::int64_t>(v); std::memcpy(base + i * 8, &x, 8); return; }
    case dtype::i32: { const auto x = saturate<std::int32_t>(v); std::memcpy(base + i * 4, &x, 4); return; }
    case dtype::i16: { const auto x = saturate<std::int16_t>(v); std::memcpy(base + i * 2, &x, 2); return; }
    case dtype::i8: base[i] = static_cast<std::byte>(saturate<std::int8_t>(v)); return;
    case dtype::u8: base[i] = static_cast<std::byte>(saturate<std::uint8_t>(v)); return;
    case dtype::boolean: base[i] = std::byte{v != 0.0}; return;
    default: throw std::invalid_argument("troupe::store_element: block type " + std::string(name(t)));
  }
}

}  // namespace troupe

#pragma once
// GGUF (versions 2 and 3, little-endian): a header of typed metadata key-value pairs and tensor infos,
// then an aligned data section. The reader bounds every count and length by the bytes that remain
// before it allocates, and validates every tensor info before it hands out a view; views point into
// the file's bytes (zero copy) and stay valid while any copy of the gguf_file that made them lives.
// Shapes are given in PyTorch order: GGUF lists dimensions fastest-first, troupe outermost-first.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/load/load_error.hpp"
#include "engine/load/named_view.hpp"

namespace troupe::load {

// The metadata value types, numbered as in the file.
enum class gguf_type : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
inline constexpr std::uint32_t gguf_type_count = 13;
std::string_view name(gguf_type t);

struct gguf_value;

// An array of one element type. Scalars are kept as their stored little-endian bytes and strings in
// one buffer with their end offsets, so a 150k-token vocabulary takes about 2.5 MB, not the ~6 MB a
// gguf_value per element would; the elements of a nested array are arrays themselves.
class gguf_array {
 public:
  gguf_type type = gguf_type::u8;

  gguf_array() = default;
  explicit gguf_array(gguf_type t);
  gguf_array(gguf_type t, std::initializer_list<gguf_value> values);
  gguf_array(gguf_type t, const std::vector<gguf_value>& values);

  std::size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  // Element i (i < size()) as a value; a string is copied.
  gguf_value at(std::size_t i) const;
  // Element i of an array of strings.
  std::string_view string_at(std::size_t i) const;
  // Element i of an array of arrays.
  const gguf_array& array_at(std::size_t i) const;
  // Element i of an array of T (the type's own C++ type: std::int32_t for i32, float for f32, ...).
  template <class T>
    requires std::is_arithmetic_v<T>
  T scalar_at(std::size_t i) const {
    T x{};
    std::memcpy(&x, scalars_.data() + i * sizeof(T), sizeof(T));
    return x;
  }

  // Appends an element. One not of `type` is not kept; the array then reports it (mismatch()) and the
  // writer refuses the array.
  void push_back(const gguf_value& v);
  template <class... A>
  void emplace_back(A&&... a);
  void reserve(std::size_t n);
  void shrink_to_fit();
  // The type of the first element appended that was not of `type`.
  std::optional<gguf_type> mismatch() const { return mismatch_; }

  friend bool operator==(const gguf_array&, const gguf_array&);

 private:
  std::size_t count_ = 0;
  std::vector<std::byte> scalars_;       // fixed-width elements
  std::string chars_;                    // strings, back to back
  std::vector<std::size_t> ends_;        // where each string ends in chars_
  std::vector<gguf_value> arrays_;       // nested arrays
  std::optional<gguf_type> mismatch_;
};

struct gguf_value {
  // The alternatives in the order of gguf_type, so index() is the type's number.
  using variant = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t, std::int32_t,
                               float, bool, std::string, gguf_array, std::uint64_t, std::int64_t, double>;
  variant v;

  gguf_value() = default;
  gguf_value(std::uint8_t x) : v(x) {}
  gguf_value(std::int8_t x) : v(x) {}
  gguf_value(std::uint16_t x) : v(x) {}
  gguf_value(std::int16_t x) : v(x) {}
  gguf_value(std::uint32_t x) : v(x) {}
  gguf_value(std::int32_t x) : v(x) {}
  gguf_value(float x) : v(x) {}
  gguf_value(bool x) : v(x) {}
  gguf_value(std::string x) : v(std::move(x)) {}
  gguf_value(std::string_view x) : v(std::string(x)) {}
  gguf_value(const char* x) : v(std::string(x)) {}
  gguf_value(gguf_array x) : v(std::move(x)) {}
  gguf_value(std::uint64_t x) : v(x) {}
  gguf_value(std::int64_t x) : v(x) {}
  gguf_value(double x) : v(x) {}

  gguf_type type() const { return static_cast<gguf_type>(v.index()); }
  template <class T>
  const T* get_if() const { return std::get_if<T>(&v); }
  // Any integer type (not bool) as int64; nullopt for other types and for a u64 above 2^63 - 1.
  std::optional<std::int64_t> as_int() const;
  // f32, f64 or any integer type as double.
  std::optional<double> as_float() const;

  friend bool operator==(const gguf_value&, const gguf_value&);
};

template <class... A>
void gguf_array::emplace_back(A&&... a) {
  push_back(gguf_value(std::forward<A>(a)...));
}

struct gguf_kv {
  std::string key;
  gguf_value value;
};

namespace detail {
struct gguf_state;
}

class gguf_file {
 public:
  // Maps the file; the mapping lives as long as the last copy of the result.
  static result<gguf_file, load_error> open(const std::filesystem::path& path);
  // Reads a whole file image held by the caller, who keeps `bytes` alive as long as the result and its
  // views; `name` stands for the file in errors.
  static result<gguf_file, load_error> parse(std::span<const std::byte> bytes, std::string name);

  const std::string& name() const;
  std::uint32_t version() const;
  std::uint32_t alignment() const;
  // Where the data section starts within the file.
  std::size_t data_offset() const;

  // In file order.
  const std::vector<gguf_kv>& metadata() const;
  std::optional<std::reference_wrapper<const gguf_value>> find_value(std::string_view key) const;

  // In file order.
  const std::vector<named_view>& tensors() const;
  std::optional<tensor_view> find(std::string_view name) const;

 private:
  explicit gguf_file(std::shared_ptr<const detail::gguf_state> s) : state_(std::move(s)) {}
  std::shared_ptr<const detail::gguf_state> state_;
};

struct gguf_write_options {
  std::uint32_t version = 3;     // 2 or 3: the layouts are the same, the number differs
  std::uint32_t alignment = 32;  // a power of two; stored as general.alignment when not 32
};

// Collects metadata and tensors, then writes a GGUF file: metadata in the order added, tensors in the
// order added, each at an aligned offset. Everything is checked when written (and refused there with a
// load_error): duplicate or non-UTF-8 names, arrays whose elements are not all of their declared type,
// tensors with no GGUF type or more than four dimensions, an alignment that is not a power of two.
class gguf_writer {
 public:
  explicit gguf_writer(gguf_write_options options = {}) : options_(options) {}

  void add(std::string key, gguf_value value) { kvs_.push_back({std::move(key), std::move(value)}); }
  // The view's bytes are read when the file is written; they must be alive until then.
  void add_tensor(std::string name, tensor_view view) { tensors_.push_back({std::move(name), view}); }

  result<void, load_error> write(const std::filesystem::path& path) const;
  // The whole file image in memory; `name` stands for the file in errors.
  result<std::vector<std::byte>, load_error> serialize(const std::string& name) const;

 private:
  gguf_write_options options_;
  std::vector<gguf_kv> kvs_;
  std::vector<named_view> tensors_;
};

}  // namespace troupe::load

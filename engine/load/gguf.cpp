#include "engine/load/gguf.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>

#include "engine/load/detail/file_writer.hpp"
#include "engine/load/detail/mapped_file.hpp"
#include "engine/load/detail/utf8.hpp"

namespace troupe::load {

static_assert(std::endian::native == std::endian::little, "GGUF is read by copying little-endian bytes");

struct detail::gguf_state {
  std::string name;
  std::shared_ptr<const detail::mapped_file> mapping;  // null when the caller owns the bytes
  std::uint32_t version = 0;
  std::uint32_t alignment = 32;
  std::size_t data_offset = 0;
  std::vector<gguf_kv> metadata;
  std::map<std::string, std::size_t, std::less<>> metadata_index;
  std::vector<named_view> tensors;
  std::map<std::string, std::size_t, std::less<>> tensor_index;
};

std::string_view name(gguf_type t) {
  switch (t) {
    case gguf_type::u8: return "uint8";
    case gguf_type::i8: return "int8";
    case gguf_type::u16: return "uint16";
    case gguf_type::i16: return "int16";
    case gguf_type::u32: return "uint32";
    case gguf_type::i32: return "int32";
    case gguf_type::f32: return "float32";
    case gguf_type::boolean: return "bool";
    case gguf_type::string: return "string";
    case gguf_type::array: return "array";
    case gguf_type::u64: return "uint64";
    case gguf_type::i64: return "int64";
    case gguf_type::f64: return "float64";
  }
  return "unknown";
}

namespace {

// The fewest bytes one element of a type takes in the file, which bounds a count before allocating.
std::size_t min_bytes(gguf_type t) {
  switch (t) {
    case gguf_type::u8: case gguf_type::i8: case gguf_type::boolean: return 1;
    case gguf_type::u16: case gguf_type::i16: return 2;
    case gguf_type::u32: case gguf_type::i32: case gguf_type::f32: return 4;
    case gguf_type::u64: case gguf_type::i64: case gguf_type::f64: return 8;
    case gguf_type::string: return 8;   // the length
    case gguf_type::array: return 12;   // element type and count
  }
  return 1;
}

}  // namespace

gguf_array::gguf_array(gguf_type t) : type(t) {}

gguf_array::gguf_array(gguf_type t, std::initializer_list<gguf_value> values) : type(t) {
  reserve(values.size());
  for (const auto& v : values) push_back(v);
}

gguf_array::gguf_array(gguf_type t, const std::vector<gguf_value>& values) : type(t) {
  reserve(values.size());
  for (const auto& v : values) push_back(v);
}

void gguf_array::reserve(std::size_t n) {
  if (type == gguf_type::string) ends_.reserve(n);
  else if (type == gguf_type::array) arrays_.reserve(n);
  else scalars_.reserve(n * min_bytes(type));  // a scalar's width
}

void gguf_array::push_back(const gguf_value& v) {
  if (v.type() != type) {
    if (!mismatch_) mismatch_ = v.type();
    return;
  }
  if (const auto* str = v.get_if<std::string>()) {
    chars_ += *str;
    ends_.push_back(chars_.size());
  } else if (type == gguf_type::array) {
    arrays_.push_back(v);
  } else {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_arithmetic_v<T>) {
            const auto* p = reinterpret_cast<const std::byte*>(&x);
            scalars_.insert(scalars_.end(), p, p + sizeof(T));
          }
        },
        v.v);
  }
  ++count_;
}

void gguf_array::shrink_to_fit() {
  scalars_.shrink_to_fit();
  chars_.shrink_to_fit();
  ends_.shrink_to_fit();
  arrays_.shrink_to_fit();
}

std::string_view gguf_array::string_at(std::size_t i) const {
  const std::size_t begin = i == 0 ? 0 : ends_[i - 1];
  return std::string_view(chars_).substr(begin, ends_[i] - begin);
}

const gguf_array& gguf_array::array_at(std::size_t i) const { return *arrays_[i].get_if<gguf_array>(); }

gguf_value gguf_array::at(std::size_t i) const {
  switch (type) {
    case gguf_type::u8: return scalar_at<std::uint8_t>(i);
    case gguf_type::i8: return scalar_at<std::int8_t>(i);
    case gguf_type::u16: return scalar_at<std::uint16_t>(i);
    case gguf_type::i16: return scalar_at<std::int16_t>(i);
    case gguf_type::u32: return scalar_at<std::uint32_t>(i);
    case gguf_type::i32: return scalar_at<std::int32_t>(i);
    case gguf_type::f32: return scalar_at<float>(i);
    case gguf_type::boolean: return scalar_at<bool>(i);
    case gguf_type::string: return string_at(i);
    case gguf_type::array: return arrays_[i];
    case gguf_type::u64: return scalar_at<std::uint64_t>(i);
    case gguf_type::i64: return scalar_at<std::int64_t>(i);
    case gguf_type::f64: return scalar_at<double>(i);
  }
  return {};
}

bool operator==(const gguf_array& a, const gguf_array& b) {
  return a.type == b.type && a.count_ == b.count_ && a.scalars_ == b.scalars_ && a.chars_ == b.chars_ &&
         a.ends_ == b.ends_ && a.arrays_ == b.arrays_ && a.mismatch_ == b.mismatch_;
}
bool operator==(const gguf_value& a, const gguf_value& b) { return a.v == b.v; }

std::optional<std::int64_t> gguf_value::as_int() const {
  switch (type()) {
    case gguf_type::u8: return *get_if<std::uint8_t>();
    case gguf_type::i8: return *get_if<std::int8_t>();
    case gguf_type::u16: return *get_if<std::uint16_t>();
    case gguf_type::i16: return *get_if<std::int16_t>();
    case gguf_type::u32: return *get_if<std::uint32_t>();
    case gguf_type::i32: return *get_if<std::int32_t>();
    case gguf_type::i64: return *get_if<std::int64_t>();
    case gguf_type::u64: {
      const auto u = *get_if<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
      return static_cast<std::int64_t>(u);
    }
    default: return std::nullopt;
  }
}

std::optional<double> gguf_value::as_float() const {
  if (const auto* f = get_if<float>()) return *f;
  if (const auto* d = get_if<double>()) return *d;
  if (const auto* u = get_if<std::uint64_t>()) return static_cast<double>(*u);
  if (const auto i = as_int()) return static_cast<double>(*i);
  return std::nullopt;
}

namespace {

constexpr char magic[4] = {'G', 'G', 'U', 'F'};
// ggml's GGML_MAX_DIMS.
constexpr std::uint32_t max_dims = 4;
// Real files nest arrays one level deep; the bound keeps a crafted file from exhausting the stack.
constexpr int max_array_depth = 32;
constexpr std::uint32_t default_alignment = 32;
constexpr std::string_view alignment_key = "general.alignment";

std::string range_str(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

class parser {
 public:
  parser(std::span<const std::byte> bytes, const std::string& file) : b_(bytes), file_(file) {}

  troupe::unexpected<load_error> fail(load_error_code code, std::string_view item, std::string reason) const {
    return troupe::unexpected(load_error{code, file_, detail::printable(item), std::move(reason)});
  }
  troupe::unexpected<load_error> truncated(std::string_view item, const std::string& what) const {
    return fail(load_error_code::truncated_header, item,
                "the file (" + std::to_string(b_.size()) + " bytes) ends inside " + what + " at byte " +
                    std::to_string(pos_));
  }

  std::size_t pos() const { return pos_; }
  std::size_t left() const { return b_.size() - pos_; }

  template <class T>
  bool read(T& out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(&out, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // A u64 length, then that many bytes; the length is bounded by what remains.
  bool read_string(std::string& out) {
    std::uint64_t n = 0;
    if (!read(n) || n > left()) return false;
    out.assign(reinterpret_cast<const char*>(b_.data()) + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return true;
  }

  result<gguf_type, load_error> read_type(std::string_view key, const char* what) {
    std::uint32_t t = 0;
    if (!read(t)) return truncated(key, what);
    if (t >= gguf_type_count) return fail(load_error_code::bad_metadata, key, "unknown value type " + std::to_string(t));
    return static_cast<gguf_type>(t);
  }

  result<gguf_value, load_error> read_value(gguf_type t, std::string_view key, int depth) {
    switch (t) {
      case gguf_type::u8: return scalar<std::uint8_t>(key);
      case gguf_type::i8: return scalar<std::int8_t>(key);
      case gguf_type::u16: return scalar<std::uint16_t>(key);
      case gguf_type::i16: return scalar<std::int16_t>(key);
      case gguf_type::u32: return scalar<std::uint32_t>(key);
      case gguf_type::i32: return scalar<std::int32_t>(key);
      case gguf_type::f32: return scalar<float>(key);
      case gguf_type::u64: return scalar<std::uint64_t>(key);
      case gguf_type::i64: return scalar<std::int64_t>(key);
      case gguf_type::f64: return scalar<double>(key);
      case gguf_type::boolean: {
        std::uint8_t b = 0;
        if (!read(b)) return truncated(key, "a bool value");
        if (b > 1) return fail(load_error_code::bad_metadata, key, "bool byte " + std::to_string(b) + " is neither 0 nor 1");
        return gguf_value(b == 1);
      }
      case gguf_type::string: {
        std::string s;
        if (!read_string(s)) return truncated(key, "a string value");
        return gguf_value(std::move(s));
      }
      case gguf_type::array: {
        if (depth >= max_array_depth)
          return fail(load_error_code::bad_metadata, key,
                      "arrays nested deeper than " + std::to_string(max_array_depth) + " levels");
        auto elem = read_type(key, "an array's element type");
        if (!elem) return troupe::unexpected(std::move(elem.error()));
        std::uint64_t count = 0;
        if (!read(count)) return truncated(key, "an array's length");
        if (count > left() / min_bytes(*elem))
          return fail(load_error_code::truncated_header, key,
                      "an array of " + std::to_string(count) + " " + std::string(name(*elem)) +
                          " values cannot fit in the " + std::to_string(left()) + " bytes left");
        gguf_array a(*elem);
        a.reserve(static_cast<std::size_t>(count));
        for (std::uint64_t i = 0; i < count; ++i) {
          auto v = read_value(*elem, key, depth + 1);
          if (!v) return troupe::unexpected(std::move(v.error()));
          a.push_back(*v);
        }
        a.shrink_to_fit();
        return gguf_value(std::move(a));
      }
    }
    return fail(load_error_code::bad_metadata, key, "unknown value type");
  }

 private:
  template <class T>
  result<gguf_value, load_error> scalar(std::string_view key) {
    T x{};
    if (!read(x)) return truncated(key, "a value");
    return gguf_value(x);
  }

  std::span<const std::byte> b_;
  const std::string& file_;
  std::size_t pos_ = 0;
};

struct tensor_info {
  std::string name;
  dtype type;
  troupe::shape shape;
  std::uint64_t offset;
  std::uint64_t bytes;
};

result<std::shared_ptr<detail::gguf_state>, load_error> parse_image(std::span<const std::byte> bytes,
                                                                     std::string name) {
  auto st = std::make_shared<detail::gguf_state>();
  st->name = std::move(name);
  parser p(bytes, st->name);

  char m[4] = {};
  if (!p.read(m)) return p.truncated("", "the magic");
  if (std::memcmp(m, magic, 4) != 0)
    return p.fail(load_error_code::bad_magic, "",
                  "starts with '" + detail::printable(std::string_view(m, 4)) + "', expected 'GGUF'");
  if (!p.read(st->version)) return p.truncated("", "the version");
  if (st->version == 1)
    return p.fail(load_error_code::unsupported_version, "", "GGUF version 1 (32-bit counts) is not supported");
  if (st->version != 2 && st->version != 3)
    return p.fail(load_error_code::unsupported_version, "",
                  "GGUF version " + std::to_string(st->version) + " is not supported (2 and 3 are)");
  std::uint64_t tensor_count = 0, kv_count = 0;
  if (!p.read(tensor_count)) return p.truncated("", "the tensor count");
  if (!p.read(kv_count)) return p.truncated("", "the metadata count");
  // A pair takes at least a key length, a type and a byte; a tensor info a name length, n_dims, a type
  // and an offset.
  if (kv_count > p.left() / 13)
    return p.fail(load_error_code::truncated_header, "",
                  std::to_string(kv_count) + " metadata pairs cannot fit in the " + std::to_string(p.left()) +
                      " bytes left");
  if (tensor_count > p.left() / 24)
    return p.fail(load_error_code::truncated_header, "",
                  std::to_string(tensor_count) + " tensor infos cannot fit in the " + std::to_string(p.left()) +
                      " bytes left");

  st->metadata.reserve(static_cast<std::size_t>(kv_count));
  for (std::uint64_t i = 0; i < kv_count; ++i) {
    const std::string nth = "metadata pair #" + std::to_string(i);
    std::string key;
    if (!p.read_string(key)) return p.truncated(nth, "a key");
    if (!detail::valid_utf8(key)) return p.fail(load_error_code::non_utf8_key, key, "metadata key is not valid UTF-8");
    if (st->metadata_index.count(key)) return p.fail(load_error_code::duplicate_name, key, "metadata key given twice");
    auto type = p.read_type(key, "a value type");
    if (!type) return troupe::unexpected(std::move(type.error()));
    auto value = p.read_value(*type, key, 0);
    if (!value) return troupe::unexpected(std::move(value.error()));
    st->metadata_index.emplace(key, st->metadata.size());
    st->metadata.push_back({std::move(key), std::move(*value)});
  }

  if (const auto it = st->metadata_index.find(alignment_key); it != st->metadata_index.end()) {
    const gguf_value& v = st->metadata[it->second].value;
    const auto* a = v.get_if<std::uint32_t>();
    if (!a)
      return p.fail(load_error_code::bad_alignment, alignment_key,
                    "is " + std::string(load::name(v.type())) + ", expected uint32");
    if (!std::has_single_bit(*a))
      return p.fail(load_error_code::bad_alignment, alignment_key, std::to_string(*a) + " is not a power of two");
    st->alignment = *a;
  }

  std::vector<tensor_info> infos;
  infos.reserve(static_cast<std::size_t>(tensor_count));
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    const std::string nth = "tensor info #" + std::to_string(i);
    tensor_info t;
    if (!p.read_string(t.name)) return p.truncated(nth, "a tensor name");
    if (!detail::valid_utf8(t.name)) return p.fail(load_error_code::non_utf8_key, t.name, "tensor name is not valid UTF-8");
    if (st->tensor_index.count(t.name)) return p.fail(load_error_code::duplicate_name, t.name, "tensor given twice");
    std::uint32_t n_dims = 0;
    if (!p.read(n_dims)) return p.truncated(t.name, "the dimension count");
    if (n_dims > max_dims)
      return p.fail(load_error_code::bad_header, t.name,
                    std::to_string(n_dims) + " dimensions, at most " + std::to_string(max_dims) + " allowed");
    std::int64_t dims[max_dims] = {};
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      std::uint64_t ne = 0;
      if (!p.read(ne)) return p.truncated(t.name, "the dimensions");
      if (ne > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return p.fail(load_error_code::shape_overflow, t.name, "dimension " + std::to_string(ne) + " above 2^63 - 1");
      dims[n_dims - 1 - d] = static_cast<std::int64_t>(ne);  // fastest-first in the file, last in troupe
    }
    std::uint32_t ggml_type = 0;
    if (!p.read(ggml_type)) return p.truncated(t.name, "the tensor type");
    const auto type = dtype_from_gguf(ggml_type);
    if (!type) return p.fail(load_error_code::unknown_dtype, t.name, "unknown ggml type " + std::to_string(ggml_type));
    t.type = *type;
    if (!p.read(t.offset)) return p.truncated(t.name, "the tensor offset");

    t.shape = troupe::shape(std::span<const std::int64_t>(dims, n_dims));
    const auto numel = t.shape.checked_numel();
    if (!numel) return p.fail(load_error_code::shape_overflow, t.name, "element count of " + t.shape.str() + " overflows");
    const auto block = info(t.type).block_elems;
    if (block > 1 && (n_dims == 0 || static_cast<std::uint64_t>(t.shape.back()) % block != 0))
      return p.fail(load_error_code::bad_header, t.name,
                    "innermost dimension of " + t.shape.str() + " is not a whole number of " +
                        std::string(troupe::name(t.type)) + " blocks of " + std::to_string(block));
    const auto size = storage_bytes(t.type, static_cast<std::uint64_t>(*numel));
    if (!size)
      return p.fail(load_error_code::shape_overflow, t.name,
                    "byte count of " + t.shape.str() + " in " + std::string(troupe::name(t.type)) + " overflows");
    t.bytes = *size;
    if (t.offset % st->alignment != 0)
      return p.fail(load_error_code::bad_alignment, t.name,
                    "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                        std::to_string(st->alignment));
    st->tensor_index.emplace(t.name, infos.size());
    infos.push_back(std::move(t));
  }

  const std::size_t end_of_header = p.pos();
  const std::size_t pad = (st->alignment - end_of_header % st->alignment) % st->alignment;
  // The padding may itself be cut off; then the data section is empty.
  const std::size_t data_start = std::min(end_of_header + pad, bytes.size());
  st->data_offset = end_of_header + pad;
  const std::uint64_t data_size = end_of_header + pad <= bytes.size() ? bytes.size() - (end_of_header + pad) : 0;

  // Of the tensors past the end, the one that starts first tells a cut file (it starts inside the data,
  // the file just stops) from an offset pointing elsewhere.
  const tensor_info* past = nullptr;
  for (const auto& t : infos)
    if ((t.offset > data_size || t.bytes > data_size - t.offset) && (!past || t.offset < past->offset)) past = &t;
  if (past) {
    const auto range = range_str(past->offset, past->offset + past->bytes);
    if (past->offset <= data_size)
      return p.fail(load_error_code::truncated_data, past->name,
                    "needs bytes " + range + " of the data section; the file holds " + std::to_string(data_size));
    return p.fail(load_error_code::tensor_out_of_range, past->name,
                  "bytes " + range + " lie past the data section of " + std::to_string(data_size) + " bytes");
  }

  std::vector<const tensor_info*> by_offset;
  by_offset.reserve(infos.size());
  for (const auto& t : infos)
    if (t.bytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const tensor_info* a, const tensor_info* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->bytes < b->bytes;
  });
  const tensor_info* prev = nullptr;  // the tensor that ends last so far
  for (const auto* t : by_offset) {
    if (prev && t->offset < prev->offset + prev->bytes)
      return p.fail(load_error_code::tensor_overlap, t->name,
                    "bytes " + range_str(t->offset, t->offset + t->bytes) + " overlap '" +
                        detail::printable(prev->name) + "' " + range_str(prev->offset, prev->offset + prev->bytes));
    if (!prev || t->offset + t->bytes > prev->offset + prev->bytes) prev = t;
  }

  const std::byte* data = bytes.data() + data_start;
  st->tensors.reserve(infos.size());
  for (auto& t : infos)
    st->tensors.push_back(named_view{std::move(t.name), tensor_view(t.type, t.shape, data + t.offset)});
  return st;
}

}  // namespace

result<gguf_file, load_error> gguf_file::parse(std::span<const std::byte> bytes, std::string name) {
  auto st = parse_image(bytes, std::move(name));
  if (!st) return troupe::unexpected(std::move(st.error()));
  return gguf_file(std::move(*st));
}

result<gguf_file, load_error> gguf_file::open(const std::filesystem::path& path) {
  auto mapping = detail::mapped_file::open(path);
  if (!mapping) return troupe::unexpected(std::move(mapping.error()));
  auto st = parse_image((*mapping)->bytes(), path.string());
  if (!st) return troupe::unexpected(std::move(st.error()));
  (*st)->mapping = std::move(*mapping);
  return gguf_file(std::move(*st));
}

const std::string& gguf_file::name() const { return state_->name; }
std::uint32_t gguf_file::version() const { return state_->version; }
std::uint32_t gguf_file::alignment() const { return state_->alignment; }
std::size_t gguf_file::data_offset() const { return state_->data_offset; }
const std::vector<gguf_kv>& gguf_file::metadata() const { return state_->metadata; }
const std::vector<named_view>& gguf_file::tensors() const { return state_->tensors; }

std::optional<std::reference_wrapper<const gguf_value>> gguf_file::find_value(std::string_view key) const {
  const auto it = state_->metadata_index.find(key);
  if (it == state_->metadata_index.end()) return std::nullopt;
  return std::cref(state_->metadata[it->second].value);
}

std::optional<tensor_view> gguf_file::find(std::string_view name) const {
  const auto it = state_->tensor_index.find(name);
  if (it == state_->tensor_index.end()) return std::nullopt;
  return state_->tensors[it->second].view;
}

namespace {

class encoder {
 public:
  explicit encoder(const std::string& file) : file_(file) {}

  troupe::unexpected<load_error> fail(load_error_code code, std::string_view item, std::string reason) const {
    return troupe::unexpected(load_error{code, file_, detail::printable(item), std::move(reason)});
  }

  template <class T>
  void put(const T& x) {
    const auto* p = reinterpret_cast<const std::byte*>(&x);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view s) {
    put(static_cast<std::uint64_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  void pad_to(std::size_t alignment) { out_.resize((out_.size() + alignment - 1) / alignment * alignment); }

  result<void, load_error> put_value(const gguf_value& v, std::string_view key, int depth) {
    if (const auto* a = v.get_if<gguf_array>()) {
      if (depth >= max_array_depth)
        return fail(load_error_code::bad_metadata, key,
                    "arrays nested deeper than " + std::to_string(max_array_depth) + " levels");
      if (static_cast<std::uint32_t>(a->type) >= gguf_type_count)
        return fail(load_error_code::bad_metadata, key, "unknown array element type");
      if (const auto m = a->mismatch())
        return fail(load_error_code::bad_metadata, key,
                    "an array of " + std::string(name(a->type)) + " holds a " + std::string(name(*m)));
      put(static_cast<std::uint32_t>(a->type));
      put(static_cast<std::uint64_t>(a->size()));
      for (std::size_t i = 0; i < a->size(); ++i) {
        if (a->type == gguf_type::string) {
          put_string(a->string_at(i));
        } else if (auto r = put_value(a->at(i), key, depth + 1); !r) {
          return r;
        }
      }
      return {};
    }
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            put_string(x);
          } else if constexpr (std::is_same_v<T, bool>) {
            put(static_cast<std::uint8_t>(x ? 1 : 0));
          } else if constexpr (!std::is_same_v<T, gguf_array>) {
            put(x);
          }
        },
        v.v);
    return {};
  }

  std::vector<std::byte>& bytes() { return out_; }

 private:
  const std::string& file_;
  std::vector<std::byte> out_;
};

struct layout {
  std::vector<std::byte> header;  // through the padding before the data section
  std::vector<std::uint64_t> sizes;
};

result<layout, load_error> encode_header(const gguf_write_options& options, const std::vector<gguf_kv>& kvs,
                                         const std::vector<named_view>& tensors, const std::string& file) {
  encoder e(file);
  if (options.version != 2 && options.version != 3)
    return e.fail(load_error_code::unsupported_version, "",
                  "cannot write GGUF version " + std::to_string(options.version) + " (2 and 3 are written)");
  if (!std::has_single_bit(options.alignment))
    return e.fail(load_error_code::bad_alignment, alignment_key,
                  std::to_string(options.alignment) + " is not a power of two");
  std::set<std::string_view> keys;
  bool has_alignment = false;
  for (const auto& kv : kvs) {
    if (!detail::valid_utf8(kv.key)) return e.fail(load_error_code::non_utf8_key, kv.key, "metadata key is not valid UTF-8");
    if (!keys.insert(kv.key).second) return e.fail(load_error_code::duplicate_name, kv.key, "metadata key given twice");
    if (kv.key == alignment_key) {
      const auto* a = kv.value.get_if<std::uint32_t>();
      if (!a || *a != options.alignment)
        return e.fail(load_error_code::bad_alignment, kv.key, "disagrees with the writer's alignment option");
      has_alignment = true;
    }
  }
  const bool add_alignment = !has_alignment && options.alignment != default_alignment;

  e.put(magic);
  e.put(options.version);
  e.put(static_cast<std::uint64_t>(tensors.size()));
  e.put(static_cast<std::uint64_t>(kvs.size() + (add_alignment ? 1 : 0)));
  if (add_alignment) {
    e.put_string(alignment_key);
    e.put(static_cast<std::uint32_t>(gguf_type::u32));
    e.put(options.alignment);
  }
  for (const auto& kv : kvs) {
    e.put_string(kv.key);
    e.put(static_cast<std::uint32_t>(kv.value.type()));
    if (auto r = e.put_value(kv.value, kv.key, 0); !r) return troupe::unexpected(std::move(r.error()));
  }

  layout out;
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const auto& s = t.view.shape();
    if (!detail::valid_utf8(t.name)) return e.fail(load_error_code::non_utf8_key, t.name, "tensor name is not valid UTF-8");
    if (!names.insert(t.name).second) return e.fail(load_error_code::duplicate_name, t.name, "tensor given twice");
    if (s.rank() > max_dims)
      return e.fail(load_error_code::bad_header, t.name,
                    "rank " + std::to_string(s.rank()) + " above GGUF's " + std::to_string(max_dims));
    const auto id = info(t.view.type()).gguf_id;
    if (!id)
      return e.fail(load_error_code::unknown_dtype, t.name,
                    "dtype " + std::string(troupe::name(t.view.type())) + " has no GGUF type");
    const auto numel = s.checked_numel();
    const auto block = info(t.view.type()).block_elems;
    if (block > 1 && (s.rank() == 0 || s.back() % static_cast<std::int64_t>(block) != 0))
      return e.fail(load_error_code::bad_header, t.name, "innermost dimension is not a whole number of blocks");
    const auto size = numel ? storage_bytes(t.view.type(), static_cast<std::uint64_t>(*numel)) : std::nullopt;
    if (!size) return e.fail(load_error_code::shape_overflow, t.name, "shape " + s.str() + " is invalid");
    e.put_string(t.name);
    e.put(static_cast<std::uint32_t>(s.rank()));
    for (std::size_t d = s.rank(); d-- > 0;) e.put(static_cast<std::uint64_t>(s[d]));
    e.put(*id);
    e.put(offset);
    out.sizes.push_back(*size);
    offset += (*size + options.alignment - 1) / options.alignment * options.alignment;
  }
  e.pad_to(options.alignment);
  out.header = std::move(e.bytes());
  return out;
}

std::size_t padding(std::uint64_t size, std::uint32_t alignment) {
  return static_cast<std::size_t>((alignment - size % alignment) % alignment);
}

}  // namespace

result<void, load_error> gguf_writer::write(const std::filesystem::path& path) const {
  auto l = encode_header(options_, kvs_, tensors_, path.string());
  if (!l) return troupe::unexpected(std::move(l.error()));
  auto out = detail::file_writer::create(path);
  if (!out) return troupe::unexpected(std::move(out.error()));
  out->write(l->header);
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    out->write({tensors_[i].view.data(), static_cast<std::size_t>(l->sizes[i])});
    out->write_zeros(padding(l->sizes[i], options_.alignment));
  }
  return out->commit();
}

result<std::vector<std::byte>, load_error> gguf_writer::serialize(const std::string& name) const {
  auto l = encode_header(options_, kvs_, tensors_, name);
  if (!l) return troupe::unexpected(std::move(l.error()));
  std::vector<std::byte> out = std::move(l->header);
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto* p = tensors_[i].view.data();
    out.insert(out.end(), p, p + l->sizes[i]);
    out.resize(out.size() + padding(l->sizes[i], options_.alignment));
  }
  return out;
}

}  // namespace troupe::load

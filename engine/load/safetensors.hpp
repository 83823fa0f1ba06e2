#pragma once
// safetensors: an 8-byte little-endian header length, a JSON header giving each tensor's dtype, shape
// and byte range within the data section, then the data. The reader validates every header field
// before it hands out a view; views point into the file's bytes (zero copy) and stay valid while any
// copy of the safetensors_file that made them lives. A sharded checkpoint is a directory of such files
// tied together by model.safetensors.index.json.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/load/load_error.hpp"
#include "engine/load/named_view.hpp"

namespace troupe::load {
namespace detail {
struct safetensors_state;
}

// The string-to-string `__metadata__` of a safetensors header.
using string_map = std::map<std::string, std::string, std::less<>>;

class safetensors_file {
 public:
  // Maps the file; the mapping lives as long as the last copy of the result.
  static result<safetensors_file, load_error> open(const std::filesystem::path& path);
  // Reads a whole file image held by the caller, who keeps `bytes` alive as long as the result and its
  // views; `name` stands for the file in errors.
  static result<safetensors_file, load_error> parse(std::span<const std::byte> bytes, std::string name);

  const std::string& name() const;
  // In the order of their data; a tensor of no bytes sorts by its offset like any other.
  const std::vector<named_view>& tensors() const;
  std::optional<tensor_view> find(std::string_view name) const;
  const string_map& metadata() const;
  // Where the data section starts within the file.
  std::size_t data_offset() const;

 private:
  explicit safetensors_file(std::shared_ptr<const detail::safetensors_state> s) : state_(std::move(s)) {}
  std::shared_ptr<const detail::safetensors_state> state_;
};

// The tensors of a Hugging Face checkpoint directory: every shard named by the index's weight_map, or
// the single model.safetensors when there is no index.
class safetensors_dir {
 public:
  const std::vector<safetensors_file>& shards() const { return shards_; }
  std::optional<tensor_view> find(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  std::size_t total_bytes() const;

 private:
  friend result<safetensors_dir, load_error> open_safetensors_dir(const std::filesystem::path& dir);
  std::vector<safetensors_file> shards_;
  std::map<std::string, tensor_view, std::less<>> tensors_;
};

result<safetensors_dir, load_error> open_safetensors_dir(const std::filesystem::path& dir);

// Writes `tensors` in order, their data back to back (as the reference implementation requires), after
// a header padded with spaces so the data section starts 8-byte aligned. Refuses a dtype without a
// safetensors code, a duplicate or non-UTF-8 name and the reserved name `__metadata__`.
result<void, load_error> write_safetensors(const std::filesystem::path& path, std::span<const named_view> tensors,
                                           const string_map& metadata = {});

}  // namespace troupe::load

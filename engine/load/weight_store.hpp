#pragma once
// The tensors of one checkpoint, whatever its format: a .gguf file, a .safetensors file, or a Hugging
// Face directory (one model.safetensors or shards with an index). Tensors keep their stored dtype and
// bytes (zero copy). A weight_store is a cheap handle: copies share the mappings, and every view it hands
// out stays valid while any copy lives. It does not interpret names; families map roles to names.
// A quantized Hugging Face directory (GPTQ, AWQ, FP8, compressed-tensors: engine/load/hf_quant.hpp)
// shows each quantized linear as one "<prefix>.weight" in troupe's row form (q4_a32, q8_a32, fp8_s32),
// built once at open, in place of the tensors it was stored as (and "<prefix>.input_perm" for
// act-order GPTQ).
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/load/gguf.hpp"
#include "engine/load/hf_quant.hpp"
#include "engine/load/load_error.hpp"

namespace troupe::load {

enum class weight_format { safetensors, gguf };
std::string_view name(weight_format f);

class weight_store {
 public:
  static result<weight_store, load_error> open(const std::filesystem::path& path);

  weight_format format() const;
  const std::filesystem::path& path() const;

  std::optional<tensor_view> find(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  std::size_t size() const;                // the number of tensors
  std::size_t total_bytes() const;         // of all tensor data as stored

  // Drops the resident pages wholly inside `bytes` when they lie in one of the store's file mappings (the
  // checkpoint's files, or the spill file of a quantized checkpoint's row forms; a later read faults them
  // back in from the file); anything else (a row form kept in memory, memory of the caller's) is left
  // alone. For bytes a reader has copied into a form of its own.
  // `covering`: also the pages the bytes share with neighbouring tensors (detail::release_pages).
  void release_pages(const tensor_view& bytes, bool covering = false) const;
  // Whether `bytes` lie in one of the checkpoint's file mappings (release_pages would drop them).
  bool file_backed(const tensor_view& bytes) const;

  // The quantization a Hugging Face directory declares, when it does.
  const std::optional<hf_quant_config>& quantization() const;

  // The GGUF file itself (metadata included) when the checkpoint is one.
  std::optional<std::reference_wrapper<const gguf_file>> gguf() const;

 private:
  struct impl;
  explicit weight_store(std::shared_ptr<const impl> i) : impl_(std::move(i)) {}
  std::shared_ptr<const impl> impl_;
};

}  // namespace troupe::load

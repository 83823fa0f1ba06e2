#pragma once
// A loaded model: the family resolved from the configuration (before any weight is read), the weight
// store, the family's model built over it, and its text codec (tokenizer and chat template) from the
// checkpoint's own files. Shared by reference: one handle can back several drivers. A checkpoint
// without a usable tokenizer still loads (token ids work); `text()` is then null and `text_problem()`
// says why.
#include <filesystem>
#include <memory>

#include "engine/load/raw_config.hpp"
#include "engine/load/weight_store.hpp"
#include "engine/text/text_codec.hpp"
#include "families/pooling.hpp"
#include "families/registry.hpp"
#include "families/vision/vision.hpp"

namespace troupe::families {

class model_handle {
 public:
  // A GGUF file, or a Hugging Face directory (config.json and one or many safetensors).
  static result<std::shared_ptr<const model_handle>, model_error> load(const std::filesystem::path& path, const registry& reg);
  // With the vision tower of an mmproj GGUF (llama.cpp's clip file) beside a GGUF text model; empty:
  // none, unless the checkpoint directory carries its own (families/vision).
  static result<std::shared_ptr<const model_handle>, model_error> load(const std::filesystem::path& path, const registry& reg,
                                                                      const std::filesystem::path& mmproj);
  // The model's vision tower, or null.
  const vision_tower* vision() const { return vision_.get(); }

  const families::model& model() const { return *model_; }
  const family_entry& family() const { return *family_; }
  const load::raw_config& config() const { return config_; }
  const load::weight_store& store() const { return store_; }
  const std::filesystem::path& path() const { return path_; }
  const text::text_codec* text() const { return text_ ? &*text_ : nullptr; }
  const std::string& text_problem() const { return text_problem_; }
  // How embeddings pool the encode program's hidden states (families/pooling.hpp), as declared.
  const families::pooling& pooling() const { return pooling_; }

  // Rank `rank` of a `size`-way tensor-parallel split of this model (model::shard), as a handle of its
  // own over the same checkpoint, configuration and tokenizer.
  result<std::shared_ptr<const model_handle>, model_error> shard(int rank, int size) const;
  // This model split by whole experts when sharded (model::expert_parallel), likewise.
  result<std::shared_ptr<const model_handle>, model_error> expert_parallel() const;
  // This model with its KV cache stored as `t` (model::with_kv_type), likewise.
  result<std::shared_ptr<const model_handle>, model_error> with_kv_type(dtype t) const;
  // Stage `stage` of a `stages`-deep pipeline split of this model (model::stage), likewise.
  result<std::shared_ptr<const model_handle>, model_error> stage(int stage, int stages) const;
  // The part of a tensor_parallel x pipeline_parallel split that world rank `stage * tp + rank` runs:
  // shard `rank` of `tp`, then stage `stage` of `pp` of that shard. 1 x 1 is refused: that is this
  // handle itself.
  result<std::shared_ptr<const model_handle>, model_error> part(int rank, int tp, int stage, int pp) const;

 private:
  // A handle of its own over `m` (a part of this model), with this one's checkpoint and text codec.
  result<std::shared_ptr<const model_handle>, model_error> over(result<std::unique_ptr<families::model>, model_error> m) const;
  model_handle(std::filesystem::path p, const family_entry* f, load::raw_config c, load::weight_store s,
               std::unique_ptr<families::model> m)
      : path_(std::move(p)), family_(f), config_(std::move(c)), store_(std::move(s)), model_(std::move(m)) {}
  std::filesystem::path path_;
  const family_entry* family_;
  load::raw_config config_;
  load::weight_store store_;
  std::unique_ptr<families::model> model_;
  std::optional<text::text_codec> text_;
  std::string text_problem_;
  families::pooling pooling_;
  std::shared_ptr<const vision_tower> vision_;
};

// `h` with its KV cache stored as `t`: h itself when the cache is `t` already or the model has no step
// program (an encoder caches nothing), else h->with_kv_type(t). A deployment's --kv-type goes through
// this, so its default applies to every model a deployment can serve.
result<std::shared_ptr<const model_handle>, model_error> with_kv_type(std::shared_ptr<const model_handle> h, dtype t);
// The same by the type's name (kv_type_from_name: empty is f16); an unknown name is a config_error on
// kv_type naming it.
result<std::shared_ptr<const model_handle>, model_error> with_kv_type(std::shared_ptr<const model_handle> h, std::string_view type_name);

// The configuration of a checkpoint, read without its tensors.
result<load::raw_config, model_error> read_config(const std::filesystem::path& path);

}  // namespace troupe::families

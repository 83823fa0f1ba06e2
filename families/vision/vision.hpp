#pragma once
// Vision towers: a family's image encoder as its own model offering the encode program, over the
// request input `pixels` (one row of 3 p p normalized values per patch, channel-major within the
// patch) and giving `embeds` [tokens, text hidden], the rows a prompt's image positions take in
// place of token embeddings (docs/vision.md). The tower comes from a Hugging Face directory beside
// the text model (config.json's vision_config) or from llama.cpp's mmproj GGUF (general.architecture
// "clip"); the front end decodes an image (PNG through libpng, JPEG through libjpeg-turbo), resizes it as the
// checkpoint says and cuts it into patches.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/load/raw_config.hpp"
#include "engine/load/weight_store.hpp"
#include "families/model.hpp"
#include "families/vision/image.hpp"

namespace troupe::families {

enum class projector_kind : std::uint8_t { gemma3 };  // SigLIP, average-pooled, RMS-normed, projected

struct vision_spec {
  projector_kind projector = projector_kind::gemma3;
  std::int64_t hidden = 0, ffn = 0, layers = 0, heads = 0;
  std::int64_t image_size = 0, patch = 0;
  std::int64_t merge = 4;        // Gemma 3: the average pool's kernel and stride over the patch grid
  std::int64_t text_hidden = 0;  // the width of each output row
  double eps = 1e-6;
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f}, std{0.5f, 0.5f, 0.5f};
  // The image's place in the prompt: the text before and after its rows, and whether the image's
  // rows attend to each other both ways in the text model (Gemma 3).
  std::string begin_text = "<start_of_image>", end_text = "<end_of_image>";
  bool bidirectional = true;
  std::int32_t begin_id = -1, end_id = -1;  // the checkpoint's own ids for them (-1: the tokenizer's)

  std::int64_t grid() const { return image_size / patch; }
  std::int64_t patches() const { return grid() * grid(); }
  std::int64_t tokens() const { return (grid() / merge) * (grid() / merge); }
  std::int64_t patch_values() const { return 3 * patch * patch; }
};

// The name of the request input the encoder reads.
inline constexpr const char* pixels_input = "pixels";

struct vision_tower {
  vision_spec spec;
  std::unique_ptr<model> encoder;  // offers program::encode: `pixels` [patches, 3 p p] -> `embeds`
  std::shared_ptr<const load::weight_store> store;  // an mmproj's own store (null: the text model's)
};

// The tower's input for one image: resized to image_size square keeping its aspect ratio (scaled
// sizes rounded up, centred on black, as llama.cpp's fixed-size preprocessing pads), scaled to
// [0, 1], normalized by the mean and std, and cut into patches row-major: f32 [patches, 3 p p].
tensor preprocess(const image_u8& img, const vision_spec& s);

// The tower of a Gemma 3 checkpoint directory (config.json with vision_config; the tensors under
// vision_tower.vision_model and multi_modal_projector, with or without a leading "model.").
result<vision_tower, model_error> vision_from_hf(const load::raw_config& cfg, const load::weight_store& store);
// The tower of an mmproj GGUF (llama.cpp's clip.* keys, v.* and mm.* tensors).
result<vision_tower, model_error> vision_from_mmproj(const std::filesystem::path& path);

}  // namespace troupe::families

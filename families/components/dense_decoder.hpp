#pragma once
// A dense decoder: `standard_stack` over `standard_layer` with the shared attention and feed-forward,
// configured by data. Families whose layers are all of this kind (Llama, Mistral, Qwen 2/3, Gemma 2/3,
// Phi-3) parse their configuration into a `dense_decoder_spec` and their name table into a weight map;
// this class is the tracer they share. Per-layer attention parameters carry what varies by layer
// (sliding window, rotary base).
#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "families/components/decoder.hpp"
#include "families/components/gated_delta.hpp"
#include "families/components/mamba2.hpp"
#include "families/components/moe.hpp"
#include "families/components/mtp.hpp"
#include "families/components/shortconv.hpp"
#include "families/family_error.hpp"
#include "families/model.hpp"

namespace troupe::families {

struct dense_decoder_spec {
  model_config config;
  stack_params stack;
  std::vector<attention_params> attention;  // one per layer
  ffn_params ffn;
  // A routed model's feed-forward per layer (empty, or experts 0 for a layer: the dense `ffn`).
  std::vector<moe_params> moe;
  bool expert_parallel = false;  // shards hold whole experts (model::expert_parallel)
  dtype kv_type = dtype::f32;    // the attention KV states' element type (model::with_kv_type)
  // Multi-token-prediction layers after the stack (components/mtp.hpp), whose weights the checkpoint
  // keeps at layers [layers, layers + mtp_layers); `attention` and `moe` then hold their entries too.
  // The first is the model's draft program. Splits (shards, stages) leave them out.
  std::int64_t mtp_layers = 0;
  mtp_options mtp;
  // What each layer is (the seed's per-layer kind that chooses the mixer); empty: every layer
  // attention + feed-forward. The others are one block each behind the layer's attn_norm: a Mamba2
  // mixer (with `mamba2`'s sizes), attention alone, or the feed-forward alone (Nemotron-H's M, * and -);
  // gated_delta is a Gated DeltaNet mixer (with `gated_delta`'s sizes) followed by the layer's
  // feed-forward, as attention_ffn (Qwen3-Next's linear-attention layers); mamba2_ffn a Mamba2 mixer
  // followed by the layer's feed-forward (Granite 4's hybrid); parallel_ffn attention and a Mamba2
  // mixer side by side over the same normed input, their outputs summed, then the feed-forward
  // (Falcon-H1); shortconv_ffn a gated short convolution (components/shortconv.hpp) then the
  // feed-forward (LFM2).
  enum class layer_kind : std::uint8_t { attention_ffn, mamba2, attention_only, ffn_only, gated_delta, mamba2_ffn, parallel_ffn, shortconv_ffn };
  std::vector<layer_kind> kinds;
  mamba2_params mamba2;
  gated_delta_params gated_delta;
  shortconv_params shortconv;
  layer_kind kind(std::int64_t layer) const {
    return layer >= 0 && layer < static_cast<std::int64_t>(kinds.size()) ? kinds[static_cast<std::size_t>(layer)] : layer_kind::attention_ffn;
  }
  // Whether layer `layer`'s mixer is Mamba2 (alone or before a feed-forward).
  bool mamba2_at(std::int64_t layer) const {
    const auto k = kind(layer);
    return k == layer_kind::mamba2 || k == layer_kind::mamba2_ffn || k == layer_kind::parallel_ffn;
  }
  // Whether layer `layer` runs attention (alone, or beside a Mamba2 mixer).
  bool attends(std::int64_t layer) const {
    const auto k = kind(layer);
    return k == layer_kind::attention_ffn || k == layer_kind::attention_only || k == layer_kind::parallel_ffn;
  }
  // Whether layer `layer` runs the feed-forward after its mixer.
  bool ffn_after_mixer(std::int64_t layer) const {
    const auto k = kind(layer);
    return k == layer_kind::attention_ffn || k == layer_kind::gated_delta || k == layer_kind::mamba2_ffn || k == layer_kind::parallel_ffn ||
           k == layer_kind::shortconv_ffn;
  }
  bool recurrent() const {
    return std::any_of(kinds.begin(), kinds.end(),
                       [](layer_kind k) {
                         return k == layer_kind::mamba2 || k == layer_kind::mamba2_ffn || k == layer_kind::parallel_ffn || k == layer_kind::gated_delta ||
                                k == layer_kind::shortconv_ffn;
                       });
  }
  const moe_params* routed(std::int64_t layer) const {
    return layer >= 0 && layer < static_cast<std::int64_t>(moe.size()) && moe[static_cast<std::size_t>(layer)].experts > 0
               ? &moe[static_cast<std::size_t>(layer)]
               : nullptr;
  }
};

class dense_decoder final : public model {
 public:
  dense_decoder(dense_decoder_spec spec, families::weight_map weights);

  const model_config& config() const override { return spec_.config; }
  const model_schema& schema() const override { return schema_; }
  const families::weight_map& weights() const override { return weights_; }
  const dense_decoder_spec& spec() const { return spec_; }
  // Heads and feed-forward columns split `size` ways (query heads and the width must divide; key/value
  // heads divide, or each is shared by size / kv_heads ranks when there are fewer than ranks).
  result<std::unique_ptr<model>, model_error> shard(int rank, int size) const override;
  // Layers [L s / S, L (s + 1) / S) renumbered from 0; the embedding on the first stage, the final norm
  // and the head on the last (a tied head keeps the embedding there too). At most one stage per layer.
  result<std::unique_ptr<model>, model_error> stage(int stage, int stages) const override;
  result<std::unique_ptr<model>, model_error> expert_parallel() const override;
  // Any of f32, f16, bf16 and q8_0; q8_0 needs every attention layer's cached row per head (head_dim,
  // or a latent layer's kv_lora_rank + rope dims) to be whole blocks of 32. A model without attention
  // layers takes any of them and changes nothing.
  result<std::unique_ptr<model>, model_error> with_kv_type(dtype t) const override;
  dtype kv_type() const override { return spec_.kv_type; }

 protected:
  void trace_into(const step_spec& spec, graph::builder& b) const override;

 private:
  // This model without its multi-token-prediction layers (a split serves the step program only).
  std::unique_ptr<dense_decoder> drop_mtp() const;
  dense_decoder_spec spec_;
  families::weight_map weights_;
  model_schema schema_;
};

// The expected shape of each role of a dense decoder, from its spec (for weight_map::build).
expected_shape_fn dense_decoder_shapes(const dense_decoder_spec& spec);

// A family's rewrite of the resolved weights before they are checked against the layers (a checkpoint
// that stores a role fused or transposed, split into the roles the tracer reads).
using weight_rewrite = std::function<result<weight_map, weight_error>(const weight_map&)>;

// The first of `roles` that layer `layer` of `w` lacks, as the typed refusal a family returns for a
// layer whose block a name table could only list as optional (a hybrid's per-layer kinds).
std::optional<model_error> missing_in_layer(const weight_map& w, std::int64_t layer, std::span<const role> roles);

// Builds the weight map from `rules` and the model, or names the first bad weight.
result<std::unique_ptr<model>, model_error> make_dense_decoder(dense_decoder_spec spec, const load::weight_store& store,
                                                               std::span<const name_rule> rules, const weight_rewrite& rewrite = {});

}  // namespace troupe::families

#pragma once
// A bidirectional transformer encoder in BERT's post-norm arrangement, the model of sentence embedders
// (BERT, MiniLM, bge, e5, nomic-embed): token + token-type (+ absolute position) embeddings and a
// LayerNorm, then per layer x = LN(x + attention(x)), x = LN(x + ffn(x)), every token seeing every
// token of its row. It offers the encode program only: no KV state, no logits; its `hidden` output is
// what the driver pools. Attention and feed-forward are the decoder's shared components with
// `causal = false` (and rope, a gated SiLU feed-forward or a fused qkv for nomic-bert, by data).
//
// Weight roles: token_embd, token_types (optional: row 0 is added, as a single-segment input has),
// position_embd (when absolute positions), token_embd_norm and _bias; per layer the attention's
// (attn_q/k/v or attn_qkv, attn_output, their *_bias), attn_output_norm and _bias, ffn_up (ffn_gate),
// ffn_down and their *_bias, layer_output_norm and _bias.
#include <memory>
#include <span>

#include "families/components/decoder.hpp"
#include "families/model.hpp"

namespace troupe::families {

struct encoder_spec {
  model_config config;
  std::int64_t hidden = 0, layers = 0, max_positions = 0;
  double norm_eps = 1e-12;
  bool absolute_positions = true;  // BERT: position_embd; nomic-bert: rope in the attention instead
  attention_params attention;      // causal false
  ffn_params ffn;
};

class encoder_model final : public model {
 public:
  encoder_model(encoder_spec spec, families::weight_map weights);
  const model_config& config() const override { return spec_.config; }
  const model_schema& schema() const override { return schema_; }
  const families::weight_map& weights() const override { return weights_; }

 protected:
  void trace_into(const step_spec& spec, graph::builder& b) const override;

 private:
  encoder_spec spec_;
  families::weight_map weights_;
  model_schema schema_;
};

// Builds the weight map from `rules`, checking every role's shape against the spec.
result<std::unique_ptr<model>, model_error> make_encoder(encoder_spec spec, const load::weight_store& store, std::span<const name_rule> rules);

}  // namespace troupe::families

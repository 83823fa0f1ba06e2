#pragma once
// The shared pieces of a decoder: grouped-query attention over the KV read and write maps (or, for
// the encode program, over the row itself), gated and plain feed-forwards, and the residual pair
// `standard_layer` / `standard_stack` almost every decoder repeats. Families pass their own mixer and
// feed-forward as closures and choose options (sandwich norms, softcaps, embedding scale) by data.
//
// Weight roles read here: token_embd, output (absent when tied), output_norm, rope_freqs (optional
// per-dimension divisors of the inverse frequencies, as llama.cpp stores Llama 3 scaling); per layer
// attn_norm, attn_q, attn_k, attn_v or attn_qkv, attn_output, their *_bias, attn_q_norm, attn_k_norm,
// post_attention_norm, ffn_norm, post_ffw_norm, ffn_gate, ffn_up or ffn_gate_up, ffn_down.
#include <cstdint>
#include <functional>
#include <map>

#include "families/components/rope.hpp"
#include "families/components/trace_context.hpp"

namespace troupe::families {

struct attention_params {
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  double scale = 0.0;               // applied to q.k; usually 1 / sqrt(head_dim)
  double softcap = 0.0;             // 0: none
  std::int64_t sliding_window = 0;  // 0: attend to every earlier position
  rope_config rope;                 // rope.dims 0: no rotary embedding
  bool qk_norm = false;             // RMSNorm over each head of q and k (attn_q_norm, attn_k_norm)
  bool qk_norm_full = false;        // with qk_norm: over all of q and all of k instead (OLMoE, OLMo 2)
  bool sinks = false;               // a learned sink logit per head in the softmax (attn_sinks, gpt-oss)
  bool causal = true;               // false: every token sees every token of its row (an encoder; encode only)
  // An output gate (Qwen3-Next): attn_q yields [q | gate] per head ([2 heads head_dim, H]) and the
  // attention's output is multiplied by sigmoid(gate) before attn_output.
  bool output_gate = false;
  // q, k and v clamped to [-clip_qkv, clip_qkv] after their projections and biases (MPT's and OLMo's
  // clip_qkv, llama.cpp's clamp_kqv); 0: none.
  double clip_qkv = 0.0;
  double output_scale = 1.0;  // the output (after attn_output) times this (Falcon-H1's mup multipliers)
  // ALiBi (BLOOM, MPT) instead of a rotary embedding: head h's scores gain slope_h (key position -
  // query position), the slopes of llama.cpp / HF over `alibi_heads` heads with max bias
  // `alibi_max_bias`; a tensor-parallel shard holds heads [alibi_offset, alibi_offset + heads).
  bool alibi = false;
  double alibi_max_bias = 8.0;
  std::int64_t alibi_heads = 0, alibi_offset = 0;
  double norm_eps = 1e-6;
  bool reduce_output = false;       // a tensor-parallel shard: all_reduce the output projection's partial sums
  // Multi-head latent attention (DeepSeek-V2/V3; components/mla.hpp) when kv_lora_rank > 0: head_dim
  // is then the rotary part of each head and the cache holds latent vectors, not per-head K/V.
  struct latent {
    std::int64_t q_lora_rank = 0;   // 0: q straight from x (attn_q)
    std::int64_t kv_lora_rank = 0;  // the latent width
    std::int64_t nope = 0;          // each head's non-rotary q/k width
    std::int64_t v_dim = 0;         // each head's value width
  } mla;
};

// swiglu_oai: gpt-oss's clamped SwiGLU, min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1).
// gelu: the exact x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (BERT's "gelu"); gelu_tanh its tanh approximation.
// relu_sqr: max(x, 0)^2 (Nemotron-H's MLP).
enum class activation : std::uint8_t { silu, gelu_tanh, swiglu_oai, gelu, relu_sqr };

struct ffn_params {
  std::int64_t width = 0;  // the intermediate size
  activation act = activation::silu;
  bool gated = true;  // act(gate(x)) * up(x); otherwise act(up(x))
  double gate_scale = 1.0, down_scale = 1.0;  // act(gate_scale gate(x)) ..., down(h) down_scale (Falcon-H1's mup multipliers)
  bool reduce_output = false;  // a tensor-parallel shard: all_reduce ffn_down's partial sums
};

// The shapes the attention's and the feed-forward's projections and biases must have (outermost
// first), for hidden size H; nullopt for a role that is not theirs. Shared by every family's shape rule.
std::optional<troupe::shape> attention_shape(role r, const attention_params& a, std::int64_t H);
std::optional<troupe::shape> ffn_shape(role r, std::int64_t F, std::int64_t H);

struct stack_params {
  std::int64_t vocab = 0;
  std::int64_t hidden = 0;
  std::int64_t layers = 0;
  double norm_eps = 1e-6;
  double embed_scale = 1.0;     // Gemma multiplies embeddings by sqrt(hidden)
  double final_softcap = 0.0;   // 0: none
  bool sandwich_norms = false;  // post_attention_norm after the mixer, post_ffw_norm after the ffn
  bool pre_norms = true;        // false: no attn_norm / ffn_norm before the mixer and the ffn (OLMo 2: post norms only)
  // Request inputs (docs/vision.md): `embeds` f32 [hidden] with `embed_mask` i32 [1] (a row where the
  // mask is nonzero takes the given embedding, unscaled, in place of its token's), and `attend_until`
  // i32 [1] (a position attends to keys up to max(its own position, attend_until): an image's rows see
  // the whole image; pad -1 is causal).
  bool embeds_input = false;
  bool span_input = false;
  bool layer_norm = false;      // LayerNorm (with attn_norm_bias, ... where the checkpoint has them: MPT's have none) instead of RMSNorm
  double residual_scale = 1.0;  // the mixer's and the ffn's outputs scaled before each residual add (Granite)
  double logit_scale = 1.0;     // the logits divided by it (Granite's logits_scaling)
  std::int64_t vocab_split = 1; // a tensor-parallel shard's head holds vocab / vocab_split rows: all_gather the logits
  // A pipeline stage `stage` of `stages` (model::stage): a stage after the first receives the residual
  // stream from the one before instead of embedding tokens; a stage before the last sends its stream on
  // and outputs it as `stage_out` instead of the final norm and the head.
  std::int64_t stage = 0;
  std::int64_t stages = 1;
};

// Per-step values every layer shares (masks, clamped read indices, rotary tables), built once.
class decoder_trace {
 public:
  explicit decoder_trace(trace_context& ctx) : ctx_(ctx) {}
  trace_context& ctx() { return ctx_; }

  graph::value_id attention(graph::value_id x, std::int32_t layer, const attention_params& p);
  // Attention of q [N, Hq, D] over this step's k [N, Hkv, D] and v [N, Hkv, Dv]: in a step, written into
  // the layer's KV states (kv.k.L, kv.v.L) and read through the KV map; in encode, over the row itself.
  // `causal` false (encode only): every present token of the row, before or after. `v` invalid and
  // `value_dims` > 0: the values are the first value_dims of each key (latent attention's c), and the
  // layer keeps one state, kv.k.L.
  // `alibi_slopes` valid: ALiBi slopes [Hq] (no sinks then), with the step's key-minus-query distances.
  graph::value_id attend(graph::value_id q, graph::value_id k, graph::value_id v, std::int32_t layer, std::int64_t window,
                         double scale, double softcap = 0.0, graph::value_id sinks = {}, bool causal = true,
                         std::int64_t value_dims = 0, graph::value_id alibi_slopes = {});
  // x W^T (+ bias). With `reduce`, the product is a tensor-parallel partial sum: it is all-reduced over
  // the group before the bias, which every rank holds whole, is added once.
  graph::value_id projection(graph::value_id x, role r, std::int32_t layer, bool reduce = false);
  // The rotary inverse frequencies for `r` (declared once per step) and, in `scale`, its cos/sin scale.
  graph::value_id rope_table(const rope_config& r, double& scale);
  graph::value_id feed_forward(graph::value_id x, std::int32_t layer, const ffn_params& p);
  // `act` applied elementwise (silu, gelu_tanh or gelu; swiglu_oai is the routed experts' own).
  graph::value_id activate(graph::value_id x, activation act);

  using block_fn = std::function<graph::value_id(decoder_trace&, graph::value_id, std::int32_t)>;
  // The stack's norm of role `r` (RMSNorm, or LayerNorm with r's bias when p.layer_norm).
  graph::value_id norm(graph::value_id x, role r, std::int32_t layer, const stack_params& p);
  // x + mixer(norm(x)), then h + ffn(norm(h)); an empty `ffn` makes a mixer-only layer (Mamba2).
  graph::value_id standard_layer(graph::value_id x, std::int32_t layer, const stack_params& p, const block_fn& mixer,
                                 const block_fn& ffn);
  // Embeds the tokens, runs every layer, applies the final norm and the head, and declares the
  // program's outputs: `logits` (step) and `hidden` (encode, or a step with a hidden carry).
  void standard_stack(const stack_params& p, const block_fn& mixer, const block_fn& ffn,
                      const std::function<bool(std::int32_t)>& has_ffn = {});

 private:
  graph::value_id allow_mask(std::int64_t window, bool causal);
  graph::value_id key_positions();    // i32 [C] (a step: column c is position c) or [rows, 1, T] (encode)
  graph::value_id alibi_distances();  // f32 [rows, T, C]: each key's position minus the query's
  graph::value_id rope_freqs(const rope_config& r);
  graph::value_id read_index();
  graph::value_id encode_index();

  trace_context& ctx_;
  std::map<std::pair<std::int64_t, bool>, graph::value_id> masks_;
  graph::value_id key_positions_;
  graph::value_id alibi_distances_;
  std::map<std::int64_t, graph::value_id> zero_bias_;  // norm() of a LayerNorm stored without a bias
  std::map<std::pair<double, std::int64_t>, std::pair<graph::value_id, double>> ropes_;
  graph::value_id read_index_;
  graph::value_id encode_index_;
};

}  // namespace troupe::families

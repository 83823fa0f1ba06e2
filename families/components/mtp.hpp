#pragma once
// A multi-token-prediction layer (DeepSeek-V3's nextn layer, GLM-4.5's): the model's `draft` program.
// In the layout the serving systems use (vLLM's MTP and EAGLE proposers), draft position p pairs the
// target's final hidden state at p with the token that followed it (t_{p+1}) and predicts t_{p+2}:
//   x = eh_proj([enorm(embed(t_{p+1})), hnorm(h_p)])   (the embedding zeroed at position 0, as vLLM)
//   x = the layer's own attention and feed-forward (a standard layer at index `layer`, KV state kv.*.layer)
//   logits = shared_head_head(shared_head_norm(x))      (the model's output head when not stored)
// and outputs `hidden` = x (pre-norm), which the next draft position takes as its h.
//
// Weight roles at layer `layer`: nextn_enorm, nextn_hnorm [H], nextn_eh_proj [H, 2H],
// nextn_shared_head_norm [H], optionally nextn_embed_tokens and nextn_shared_head_head [V, H], and
// the layer's ordinary attention and feed-forward roles.
#include <optional>

#include "families/components/decoder.hpp"
#include "families/weight_map.hpp"

namespace troupe::families {

// Where the families' MTP layers differ. DeepSeek-V3 (vLLM's DeepSeekMTP): the embedding zeroed at
// position 0, `hidden` taken before the final norm. Qwen3-Next (vLLM's Qwen3NextMTP: fc over
// [pre_fc_norm_embedding(e), pre_fc_norm_hidden(h)], one full-attention layer, then mtp.norm): no
// zeroing, and the normed state is both the head's input and the next draft step's `hidden`.
struct mtp_options {
  bool zero_first_embedding = true;
  bool hidden_after_norm = false;
};

void mtp_stack(decoder_trace& d, const stack_params& p, std::int32_t layer, const decoder_trace::block_fn& mixer,
               const decoder_trace::block_fn& ffn, const mtp_options& o = {});

// The expected shape of a nextn role (hidden size H, vocabulary V), or nullopt for others.
std::optional<troupe::shape> mtp_shape(role r, std::int64_t H, std::int64_t V);

}  // namespace troupe::families

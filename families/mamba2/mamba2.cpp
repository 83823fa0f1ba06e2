// Mamba2 (HF model_type mamba2, GGUF architecture mamba2): every layer is RMSNorm then the Mamba2
// mixer (components/mamba2.hpp) and a residual add; no attention, no feed-forward, no KV cache: each
// sequence carries one conv window and one scan state per layer (state rows). HF keeps A_log (A =
// -exp(A_log)), conv1d.weight as [C, 1, K] and the gated norm as [D]; llama.cpp's converter stores
// A itself, the conv weight as [C, K] and the norm as [G, D / G]; the name table reads both.
#include "families/components/config_reader.hpp"
#include "families/components/dense_decoder.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

std::vector<name_rule> mamba2_names(bool gguf) {
  std::vector<name_rule> t;
  auto global = [&](role r, const char* key, presence p = presence::required, role tied = role::none) { t.push_back({r, false, key, p, tied}); };
  global(role::token_embd, gguf ? "token_embd.weight" : "backbone.embeddings.weight");
  global(role::output, gguf ? "output.weight" : "lm_head.weight", presence::tied, role::token_embd);
  global(role::output_norm, gguf ? "output_norm.weight" : "backbone.norm_f.weight");
  t.push_back({role::attn_norm, true, gguf ? "blk.{L}.attn_norm.weight" : "backbone.layers.{L}.norm.weight"});
  add_mamba2_names(t, gguf, "backbone.layers.{L}.mixer.", presence::required);
  return t;
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "mamba2");
  auto fail = [](config_error e) { return unexpected(model_error{std::move(e)}); };
  auto hidden = r.positive("hidden_size", "embedding_length");
  auto layers = r.positive("num_hidden_layers", "block_count");
  auto state = r.positive("state_size", "ssm.state_size");
  auto groups = r.positive_or("n_groups", "ssm.group_count", 1);
  auto conv = r.positive_or("conv_kernel", "ssm.conv_kernel", 4);
  auto eps = r.number_or("layer_norm_epsilon", "attention.layer_norm_rms_epsilon", 1e-5);
  if (auto e = first_error(hidden, layers, state, groups, conv, eps)) return fail(*e);
  std::int64_t inner = 0, heads = 0;
  if (r.gguf()) {
    auto i = r.positive("", "ssm.inner_size");
    auto h = r.positive("", "ssm.time_step_rank");
    if (auto e = first_error(i, h)) return fail(*e);
    inner = *i;
    heads = *h;
  } else {
    auto expand = r.positive_or("expand", "", 2);
    auto head_dim = r.positive_or("head_dim", "", 64);
    if (auto e = first_error(expand, head_dim)) return fail(*e);
    inner = *expand * *hidden;
    auto h = r.positive_or("num_heads", "", inner / *head_dim);
    if (!h) return fail(h.error());
    heads = *h;
    if (heads * *head_dim != inner) return fail(r.error("num_heads", "num_heads x head_dim must be expand x hidden_size"));
    auto norm_before_gate = r.flag_or("norm_before_gate", "", false);
    if (!norm_before_gate) return fail(norm_before_gate.error());
    if (*norm_before_gate) return fail(r.error("norm_before_gate", "only the gate-then-norm order of Mamba2 is supported"));
  }
  constexpr std::int64_t bound = std::int64_t{1} << 20;
  for (auto [v, what] : {std::pair{*hidden, "hidden_size"}, {inner, "inner size"}, {*state, "state_size"}, {heads, "heads"}, {*groups, "n_groups"}})
    if (v > bound) return fail(r.error(what, std::to_string(v) + " is past the bound of " + std::to_string(bound)));
  if (*layers > static_cast<std::int64_t>(store.size())) return fail(r.error(r.key("num_hidden_layers", "block_count"), "more layers than tensors"));
  if (inner % heads != 0) return fail(r.error(r.key("num_heads", "ssm.time_step_rank"), "heads must divide the inner size"));
  if (heads % *groups != 0 || inner % *groups != 0) return fail(r.error(r.key("n_groups", "ssm.group_count"), "groups must divide the heads and the inner size"));
  if (*conv < 2 || *conv > 64) return fail(r.error(r.key("conv_kernel", "ssm.conv_kernel"), "the kernel must lie in [2, 64]"));

  std::int64_t vocab = 0;
  bool tied = false;
  if (r.gguf()) {
    const auto embd = store.find("token_embd.weight");
    if (!embd || embd->shape().rank() != 2) return fail(r.error("token_embd.weight", "missing: it gives the vocabulary size"));
    vocab = embd->shape()[0];
    tied = !store.find("output.weight");
  } else {
    auto v = r.positive("vocab_size", "");
    auto t = r.flag_or("tie_word_embeddings", "", true);
    if (auto e = first_error(v, t)) return fail(*e);
    vocab = *v;
    tied = *t;
  }
  (void)tied;  // the name table reads the head as tied when the checkpoint has none

  dense_decoder_spec s;
  s.config.family = "mamba2";
  s.config.vocab = vocab;
  s.config.hidden = *hidden;
  s.config.layers = *layers;
  s.config.max_positions = 0;  // no positional limit: the state carries the context
  s.config.bos_id = r.bos_id();
  s.config.eos_ids = r.eos_ids();
  s.stack.vocab = vocab;
  s.stack.hidden = *hidden;
  s.stack.layers = *layers;
  s.stack.norm_eps = *eps;
  s.kinds.assign(static_cast<std::size_t>(*layers), dense_decoder_spec::layer_kind::mamba2);
  s.mamba2 = mamba2_params{inner, *state, heads, *groups, *conv, *eps};
  return make_dense_decoder(std::move(s), store, mamba2_names(r.gguf()));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "mamba2"}, {load::config_source::gguf, "mamba2"}};

}  // namespace

const family_entry mamba2_entry{"mamba2", keys, build};

}  // namespace troupe::families

// StarCoder 2: LayerNorm with biases (before attention, before the feed-forward, and at the end),
// q/k/v/o projections with biases, a plain GELU (tanh) feed-forward with biases (HF mlp.c_fc and
// mlp.c_proj; GGUF ffn_up and ffn_down), NeoX rotary, GQA. HF's sliding_window is not applied by
// llama.cpp's starcoder2 either (every layer attends to every earlier position within the context).
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "starcoder2");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto eps = r.number_or("norm_epsilon", "attention.layer_norm_epsilon", 1e-5);
  if (!eps) return unexpected(model_error{eps.error()});
  if (!(*eps >= 0)) return unexpected(model_error{r.error(r.key("norm_epsilon", "attention.layer_norm_epsilon"), "must be non-negative")});
  const auto act = r.text("hidden_act", "").value_or("gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh" && act != "gelu")
    return unexpected(model_error{r.error("hidden_act", "unsupported activation '" + act + "'")});
  auto spec = uniform_spec("starcoder2", *basics, r);
  spec.stack.layer_norm = true;
  spec.stack.norm_eps = *eps;
  spec.ffn.gated = false;
  spec.ffn.act = act == "gelu" ? activation::gelu : activation::gelu_tanh;
  name_table_options names;
  names.gguf = r.gguf();
  names.norm_bias = true;
  names.gated_ffn = false;
  names.hf_c_fc = true;
  return make_dense_decoder(std::move(spec), store, decoder_name_table(names));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "starcoder2"}, {load::config_source::gguf, "starcoder2"}};

}  // namespace

const family_entry starcoder2_entry{"starcoder2", keys, build};

}  // namespace troupe::families

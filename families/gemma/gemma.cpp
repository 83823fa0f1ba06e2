// Gemma (1): norms that scale by 1 + w (stored as w by HF, as w + 1 by llama.cpp's converter),
// embeddings scaled by sqrt(hidden), GeGLU (tanh GELU) feed-forwards, NeoX rotary, a head width of its
// own (head_dim; GGUF attention.key_length), the head tied to the embedding. Gemma 2 and 3 add
// sandwich norms, softcaps and sliding windows on top (their own files).
#include <cmath>

#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "gemma");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto spec = uniform_spec("gemma", *basics, r);
  spec.stack.embed_scale = std::sqrt(static_cast<double>(basics->hidden));
  spec.ffn.act = activation::gelu_tanh;
  name_table_options names;
  names.gguf = r.gguf();
  names.norms_minus_one = !r.gguf();
  return make_dense_decoder(std::move(spec), store, decoder_name_table(names));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "gemma"}, {load::config_source::gguf, "gemma"}};

}  // namespace

const family_entry gemma_entry{"gemma", keys, build};

}  // namespace troupe::families

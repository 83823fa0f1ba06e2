// Llama 2, 3, 3.1 and 3.2: the plain dense decoder (RMSNorm, GQA attention with RoPE, SwiGLU), with
// rope scaling (linear, dynamic NTK, YaRN, Llama 3) and optional attention and MLP biases. In GGUF,
// llama.cpp's converter permutes Q and K rows so RoPE rotates adjacent pairs, and keeps Llama 3's
// scaling as a rope_freqs tensor; the name table records both, so the traced step means the same.
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "llama");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto spec = uniform_spec("llama", *basics, r);
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_rope_interleaved = r.gguf();
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "llama"}, {load::config_source::gguf, "llama"}};

}  // namespace

const family_entry llama_entry{"llama", keys, build};

}  // namespace troupe::families

// SmolLM3: Llama's decoder with NoPE layers: every layer whose no_rope_layers entry is 0 attends
// without rotary embedding (HF: no_rope_layers, one 0/1 per layer, or every no_rope_layer_interval-th
// layer; GGUF: llama.cpp fixes the interval at 4, layers 3, 7, 11, ...). GGUF permutes Q/K rows as
// arch llama's (a NoPE layer's scores do not see the permutation: q and k are permuted alike).
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "smollm3");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  const auto L = basics->layers;
  std::vector<bool> rope(static_cast<std::size_t>(L), true);
  if (!r.gguf() && r.raw().has("no_rope_layers")) {
    auto flags = r.raw().get_int_array("no_rope_layers");
    if (!flags || static_cast<std::int64_t>(flags->size()) != L)
      return unexpected(model_error{r.error("no_rope_layers", "must hold a 0 or 1 for each of the " + std::to_string(L) + " layers")});
    for (std::int64_t l = 0; l < L; ++l) {
      const auto f = (*flags)[static_cast<std::size_t>(l)];
      if (f != 0 && f != 1) return unexpected(model_error{r.error("no_rope_layers", "entries are 0 (NoPE) or 1 (rotary)")});
      rope[static_cast<std::size_t>(l)] = f == 1;
    }
  } else {
    auto every = r.positive_or("no_rope_layer_interval", "", 4);
    if (!every) return unexpected(model_error{every.error()});
    for (std::int64_t l = 0; l < L; ++l) rope[static_cast<std::size_t>(l)] = (l + 1) % *every != 0;
  }
  auto spec = uniform_spec("smollm3", *basics, r);
  for (std::int64_t l = 0; l < L; ++l)
    if (!rope[static_cast<std::size_t>(l)]) spec.attention[static_cast<std::size_t>(l)].rope.dims = 0;
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_rope_interleaved = r.gguf();
  return make_dense_decoder(std::move(spec), store, decoder_name_table(names));
}

constexpr family_key keys[] = {{load::config_source::hf_json, "smollm3"}, {load::config_source::gguf, "smollm3"}};

}  // namespace

const family_entry smollm3_entry{"smollm3", keys, build};

}  // namespace troupe::families

#include "actors/model_needs.hpp"

#include <algorithm>
#include <map>

#include "engine/driver/driver.hpp"
#include "families/components/dense_decoder.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"

namespace troupe::actors {

result<placement::requirements, std::string> requirements_of(const families::model_handle& h) {
  const auto* dense = dynamic_cast<const families::dense_decoder*>(&h.model());
  if (dense == nullptr) return unexpected("the planner knows dense decoders only, not " + h.model().config().family);
  const auto& spec = dense->spec();
  // A hybrid's KV is that of its attention layers only (averaged over every layer, as the planner counts
  // KV per layer); its recurrent state is per sequence, a fixed cost of the driver's rows, counted as
  // scratch for the default max_rows (every rank and stage keeps it whole: an overestimate under a
  // split). A model with no attention layer (Mamba2) has no KV for the planner to size: refused.
  const auto carried = families::state_bytes(h.model());
  const auto kv_total = static_cast<std::uint64_t>(carried.per_token), state_per_sequence = static_cast<std::uint64_t>(carried.per_sequence);
  std::int64_t attention_layer = -1;
  for (std::int64_t l = 0; l < spec.stack.layers && attention_layer < 0; ++l) {
    const auto k = spec.kind(l);
    if (k == families::dense_decoder_spec::layer_kind::attention_ffn || k == families::dense_decoder_spec::layer_kind::attention_only) attention_layer = l;
  }
  if (attention_layer < 0)
    return unexpected("the planner sizes KV per token, and " + h.model().config().family + " has no attention layer: place it without a plan");
  placement::requirements r;
  std::map<std::int32_t, std::uint64_t> per_layer, expert_per_layer;
  bool tied = true;
  std::uint64_t embedding = 0;
  for (const auto& e : h.model().weights().entries()) {
    const auto bytes = static_cast<std::uint64_t>(e.view.bytes());
    if (e.role.layer >= 0) {
      per_layer[e.role.layer] += bytes;
      // Routed experts, stacked [E, ...] (biases [E, F] included): expert parallelism splits them whole.
      if (graph::is_expert_stack(e.role.kind)) expert_per_layer[e.role.layer] += bytes;
    } else if (e.role.kind == graph::tensor_role::token_embd) embedding += bytes;
    else if (e.role.kind == graph::tensor_role::output) tied = false, r.head_bytes += bytes;
    else if (e.role.kind == graph::tensor_role::output_norm) r.head_bytes += bytes;
    else r.embedding_bytes += bytes;  // rope tables and the like: with the first stage
  }
  r.embedding_bytes += embedding;
  if (tied) r.head_bytes += embedding;
  for (const auto& [l, b] : per_layer) r.layer_bytes = std::max(r.layer_bytes, b);
  r.experts = static_cast<std::int32_t>(families::routed_experts(spec.moe));
  if (r.experts > 0)
    for (const auto& [l, b] : expert_per_layer) r.expert_bytes = std::max(r.expert_bytes, b / static_cast<std::uint64_t>(r.experts));
  r.layers = static_cast<std::int32_t>(spec.stack.layers);
  r.kv_bytes_per_token_per_layer = static_cast<std::uint64_t>(families::kv_bytes_per_token_per_layer(h.model()));
  if (spec.recurrent()) {
    const auto layers = static_cast<std::uint64_t>(std::max<std::int64_t>(1, spec.stack.layers));
    r.kv_bytes_per_token_per_layer = (kv_total + layers - 1) / layers;
  }
  const auto& attn = spec.attention[static_cast<std::size_t>(std::max<std::int64_t>(0, attention_layer))];
  r.heads = static_cast<std::int32_t>(attn.heads);
  r.kv_heads = static_cast<std::int32_t>(attn.kv_heads);
  const auto hidden = static_cast<std::uint64_t>(spec.stack.hidden), ffn = static_cast<std::uint64_t>(spec.ffn.width);
  r.scratch_bytes = 256 * (8 * hidden + 3 * ffn) * 4 + 16 * static_cast<std::uint64_t>(spec.stack.vocab) * 4;
  r.scratch_bytes += state_per_sequence * static_cast<std::uint64_t>(driver::driver_options{}.max_rows);
  return r;
}

namespace {

std::uintmax_t checkpoint_bytes(const std::filesystem::path& p) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(p, ec)) return std::filesystem::file_size(p, ec);
  std::uintmax_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(p, ec))
    if (e.is_regular_file(ec)) n += e.file_size(ec);
  return n;
}

}  // namespace

transport::resolved_model resolve_checkpoint(const std::filesystem::path& path) {
  transport::resolved_model out;
  out.path = path.string();
  // The handle resolves the family from the configuration and maps the weights' table (no tensor data
  // is read): the family and the needs the planner places by.
  auto h = families::model_handle::load(path, families::registry::builtin());
  if (!h) {
    out.error = families::message(h.error());
    return out;
  }
  out.family = std::string((*h)->family().family);
  out.bytes = checkpoint_bytes(path);
  out.max_positions = (*h)->model().config().max_positions;
  if (auto r = requirements_of(**h)) {
    out.plannable = true;
    out.layers = r->layers;
    out.layer_bytes = r->layer_bytes;
    out.embedding_bytes = r->embedding_bytes;
    out.head_bytes = r->head_bytes;
    out.kv_bytes_per_token_per_layer = r->kv_bytes_per_token_per_layer;
    out.scratch_bytes = r->scratch_bytes;
    out.heads = r->heads;
    out.kv_heads = r->kv_heads;
    out.experts = r->experts;
    out.expert_bytes = r->expert_bytes;
  }
  return out;
}

result<dtype, std::string> kv_type_of(const transport::load_request& l) {
  if (auto t = families::kv_type_from_name(l.kv_type)) return *t;
  return unexpected("kv_type '" + l.kv_type.substr(0, 32) + "' is none of f32, f16, bf16 and q8_0");
}

std::uint64_t kv_bytes_at(std::uint64_t f32_bytes, dtype t) { return (f32_bytes * *storage_bytes(t, 32) + 127) / 128; }

placement::requirements requirements_of(const transport::resolved_model& r) {
  placement::requirements q;
  q.layers = r.layers;
  q.layer_bytes = r.layer_bytes;
  q.embedding_bytes = r.embedding_bytes;
  q.head_bytes = r.head_bytes;
  q.kv_bytes_per_token_per_layer = r.kv_bytes_per_token_per_layer;
  q.scratch_bytes = r.scratch_bytes;
  q.heads = r.heads;
  q.kv_heads = r.kv_heads;
  q.experts = r.experts;
  q.expert_bytes = r.expert_bytes;
  return q;
}

std::string served_name(const std::filesystem::path& checkpoint) {
  auto p = checkpoint.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  std::string name = p.filename().string();
  if (name == "." || name == "..") name = std::filesystem::absolute(checkpoint).lexically_normal().parent_path().filename().string();
  const auto ext = p.extension().string();
  if (ext == ".gguf" || ext == ".GGUF" || ext == ".safetensors") name = p.stem().string();
  return name;
}

void put_speculation(transport::load_request& l, const driver::speculation_options& s) {
  if (s.kind == driver::draft_kind::none) return;
  l.speculative = std::string(driver::name(s.kind));
  l.draft_tokens = static_cast<std::int32_t>(s.tokens);
  if (!s.draft_path.empty()) l.draft_model = s.draft_path;
  else if (s.draft_model) l.draft_model = std::filesystem::absolute(s.draft_model->path()).lexically_normal().string();
}

driver::driver_options replica_options(const transport::load_request& l, std::int64_t max_positions) {
  driver::driver_options o;
  if (l.max_rows > 0) o.max_rows = l.max_rows;
  if (l.block_size > 0) o.block_size = l.block_size;
  if (l.capacity > 0) {
    o.capacity = l.capacity;
  } else {
    o.capacity = max_positions > 0 ? std::min(default_capacity, max_positions) : default_capacity;
    o.capacity = std::max(o.block_size, o.capacity / o.block_size * o.block_size);
  }
  o.pool_blocks = l.pool_blocks;
  o.prefill_chunk = l.prefill_chunk > 0 ? l.prefill_chunk : std::min<std::int64_t>(256, o.capacity);
  o.token_budget = l.token_budget > 0 ? l.token_budget : o.prefill_chunk + o.max_rows;
  o.prefix_cache = !l.no_prefix_cache;
  o.preempt = !l.no_preempt;
  if (l.speculative == "ngram") o.speculation.kind = driver::draft_kind::ngram;
  if (l.speculative == "mtp") o.speculation.kind = driver::draft_kind::mtp;
  if (l.speculative == "model") o.speculation.kind = driver::draft_kind::model;  // the node loads draft_model
  if (l.draft_tokens > 0) o.speculation.tokens = l.draft_tokens;
  if (!l.adapters.empty() || l.adapter_slots > 0) {
    for (const auto& a : l.adapters) {
      const auto eq = a.find('=');
      o.adapters.preload.emplace_back(eq == std::string::npos ? a : a.substr(0, eq), eq == std::string::npos ? std::string() : a.substr(eq + 1));
    }
    o.adapters.slots = l.adapter_slots > 0 ? l.adapter_slots : std::max<std::int64_t>(1, static_cast<std::int64_t>(l.adapters.size()));
    o.adapters.max_rank = l.max_adapter_rank > 0 ? l.max_adapter_rank : 16;
  }
  return o;
}

}  // namespace troupe::actors

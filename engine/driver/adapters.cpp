// LoRA adapters (docs/adapters.md): the registry of adapters the driver has read, the pools every step
// entry reads them from (one stacked weight per target linear and layer, a slot per resident adapter),
// and residency: a running sequence's adapter holds a slot; a new one takes a free slot or evicts the
// least recently used adapter no running sequence uses.
#include <algorithm>
#include <cstring>

#include "engine/driver/driver_state.hpp"
#include "engine/load/peft.hpp"

namespace troupe::driver {

namespace {

// PEFT's module names of the linears troupe's roles stand for (Llama, Qwen, Mistral, Gemma, Phi-3's
// o_proj/down_proj, ...).
std::optional<graph::tensor_role> role_of_module(std::string_view m) {
  using enum graph::tensor_role;
  if (m == "q_proj") return attn_q;
  if (m == "k_proj") return attn_k;
  if (m == "v_proj") return attn_v;
  if (m == "o_proj") return attn_output;
  if (m == "gate_proj") return ffn_gate;
  if (m == "up_proj") return ffn_up;
  if (m == "down_proj") return ffn_down;
  return std::nullopt;
}

}  // namespace

std::vector<graph::tensor_role> default_adapter_targets() {
  using enum graph::tensor_role;
  return {attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down};
}

families::lora_spec driver_state::lora_spec() const {
  families::lora_spec l;
  if (options.adapters.slots <= 0) return l;
  l.slots = options.adapters.slots;
  l.rank = options.adapters.max_rank;
  l.targets = options.adapters.targets;
  return l;
}

result<void, driver_error> driver_state::make_adapter_pools() {
  const auto S = options.adapters.slots, R = options.adapters.max_rank;
  if (S <= 0) return {};
  const auto& w = handle->model().weights();
  for (std::int32_t layer = 0; layer < handle->model().config().layers; ++layer) {
    for (auto t : options.adapters.targets) {
      const auto* e = w.find({t, layer});
      if (!e || e->view.shape().rank() != 2) continue;  // fused or absent here: no adapter can target it
      const auto pools = *graph::lora_pools_of(t);
      const auto N = e->view.shape()[0], K = e->view.shape()[1];
      weights->own({pools.a, layer}, tensor(dtype::f32, {S, R, K}));
      weights->own({pools.b, layer}, tensor(dtype::f32, {S, N, R}));
    }
  }
  slot_owner.assign(static_cast<std::size_t>(S), std::string());
  return {};
}

std::uint64_t driver_state::root_of(const sequence& s) const {
  if (s.req.adapter.empty()) return root_hash;
  // Blocks computed under an adapter are another model's KV: their chains start from the adapter's root.
  std::uint64_t h = root_hash ^ 0xa5a5a5a5a5a5a5a5ull;
  for (unsigned char c : s.req.adapter) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

result<bool, driver_error> driver_state::acquire_adapter(sequence& s) {
  if (s.req.adapter.empty() || s.adapter_slot >= 0) return true;
  const auto it = adapters.find(s.req.adapter);
  if (it == adapters.end())  // unloaded while it waited: the sequence cannot run
    return unexpected(driver_error{driver_error_code::unknown_adapter, "adapter '" + s.req.adapter + "' is not loaded"});
  auto& a = it->second;
  if (a.slot < 0) {
    // A free slot, else the least recently used resident adapter that no running sequence uses.
    std::int32_t slot = -1;
    std::uint64_t oldest = ~std::uint64_t{0};
    for (std::size_t i = 0; i < slot_owner.size(); ++i) {
      if (slot_owner[i].empty()) {
        slot = static_cast<std::int32_t>(i);
        break;
      }
      const auto& o = adapters.at(slot_owner[i]);
      if (o.users == 0 && o.last_used < oldest) {
        oldest = o.last_used;
        slot = static_cast<std::int32_t>(i);
      }
    }
    if (slot < 0) return false;
    if (!slot_owner[static_cast<std::size_t>(slot)].empty()) adapters.at(slot_owner[static_cast<std::size_t>(slot)]).slot = -1;
    // Every pool's slot is written: the adapter's matrices where it has them, zeros elsewhere.
    const auto S = options.adapters.slots;
    for (std::int32_t layer = 0; layer < handle->model().config().layers; ++layer) {
      for (auto t : options.adapters.targets) {
        const auto pools = *graph::lora_pools_of(t);
        tensor* pa = weights->owned({pools.a, layer});
        tensor* pb = weights->owned({pools.b, layer});
        if (!pa || !pb) continue;
        const std::size_t a_bytes = pa->bytes() / static_cast<std::size_t>(S), b_bytes = pb->bytes() / static_cast<std::size_t>(S);
        std::byte* da = pa->data() + static_cast<std::size_t>(slot) * a_bytes;
        std::byte* db = pb->data() + static_cast<std::size_t>(slot) * b_bytes;
        if (const auto m = a.mats.find({t, layer}); m != a.mats.end()) {
          std::memcpy(da, m->second.first.data(), a_bytes);
          std::memcpy(db, m->second.second.data(), b_bytes);
        } else {
          std::memset(da, 0, a_bytes);
          std::memset(db, 0, b_bytes);
        }
        for (const auto role : {pools.a, pools.b})
          if (auto r = ex->reload_expert(exe, {role, layer}, slot); !r)
            return unexpected(driver_error{driver_error_code::step_failed, "loading adapter '" + s.req.adapter + "': " + r.error().message()});
      }
    }
    slot_owner[static_cast<std::size_t>(slot)] = it->first;
    a.slot = slot;
  }
  ++a.users;
  a.last_used = ++adapter_clock;
  s.adapter_slot = a.slot;
  return true;
}

void driver_state::release_adapter(sequence& s) {
  if (s.adapter_slot < 0) return;
  if (const auto it = adapters.find(s.req.adapter); it != adapters.end() && it->second.users > 0) --it->second.users;
  s.adapter_slot = -1;
}

result<void, driver_error> driver<serving>::load_adapter(const std::string& name, const std::filesystem::path& dir) {
  auto& st = *s_;
  auto bad = [&](std::string why) { return unexpected(driver_error{driver_error_code::bad_adapter, "adapter '" + name + "': " + std::move(why)}); };
  if (st.options.adapters.slots <= 0) return bad("this driver serves no adapters (adapters.slots is 0)");
  if (name.empty()) return bad("an adapter needs a name");
  if (st.adapters.contains(name)) return bad("a loaded adapter has this name already");
  auto peft = load::read_lora_adapter(dir);
  if (!peft) return bad(peft.error().message());
  const auto R = st.options.adapters.max_rank;
  if (peft->rank > R) return bad("rank " + std::to_string(peft->rank) + " is past the driver's max_rank " + std::to_string(R));
  if (peft->gguf_layout) {
    // llama.cpp's rule: a GGUF LoRA goes with a GGUF base of its architecture.
    const auto g = st.handle->model().weights().store().gguf();
    const auto arch = g ? g->get().find_value("general.architecture") : std::nullopt;
    const auto* base_arch = arch ? arch->get().get_if<std::string>() : nullptr;
    if (!base_arch) return bad("a GGUF LoRA goes with a GGUF base; this model is a Hugging Face checkpoint (load a PEFT adapter)");
    if (*base_arch != peft->arch) return bad("a LoRA for architecture '" + peft->arch + "' over a '" + *base_arch + "' base");
  }
  loaded_adapter a;
  a.path = dir.string();
  a.rank = peft->rank;
  a.scale = peft->scale();
  const auto& w = st.handle->model().weights();
  for (auto& m : peft->modules) {
    const std::string where = "layers." + std::to_string(m.layer) + "." + m.module;
    const auto role = peft->gguf_layout ? graph::role_from_name(m.module) : role_of_module(m.module);
    if (!role || !graph::lora_pools_of(*role)) return bad(where + ": troupe adapts q/k/v/o_proj and gate/up/down_proj, not " + m.module);
    if (std::find(st.options.adapters.targets.begin(), st.options.adapters.targets.end(), *role) == st.options.adapters.targets.end())
      return bad(where + ": the driver's adapters.targets leave out " + std::string(graph::role_name(*role)));
    const auto pools = *graph::lora_pools_of(*role);
    const tensor* pa = st.weights->owned({pools.a, m.layer});
    const auto* e = w.find({*role, m.layer});
    if (!pa || !e) return bad(where + ": the model has no separate " + std::string(graph::role_name(*role)) + " in that layer (fused or absent)");
    // A GGUF LoRA is laid out as a GGUF base is (its converter permutes Q/K rows as the base's did); a
    // PEFT adapter as the Hugging Face checkpoint is.
    const bool permuted = e->stored == families::stored_as::rope_interleaved;
    if ((e->stored != families::stored_as::as_is && !permuted) || (permuted && !peft->gguf_layout))
      return bad(where + ": the base stores " + std::string(graph::role_name(*role)) + " transformed (a GGUF base's permuted Q/K rows); " +
                 "load a PEFT adapter over the Hugging Face checkpoint, or the adapter's GGUF form over the GGUF base");
    if (e->input_perm) return bad(where + ": the base's act-order quantized weight takes its inputs reordered");
    const auto N = e->view.shape()[0], K = e->view.shape()[1];
    if (m.a.shape()[1] != K || m.b.shape()[0] != N)
      return bad(where + ": lora_A " + m.a.shape().str() + " / lora_B " + m.b.shape().str() + " do not fit the model's [" + std::to_string(N) +
                 ", " + std::to_string(K) + "] weight");
    // A [r, K] into [R, K]; scale * B [N, r] into [N, R]; the rest zeros.
    tensor pa_m(dtype::f32, {R, K}), pb_m(dtype::f32, {N, R});
    std::memcpy(pa_m.data(), m.a.data(), m.a.bytes());
    const float sc = static_cast<float>(a.scale);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t j = 0; j < a.rank; ++j) pb_m.as<float>()[n * R + j] = sc * m.b.as<float>()[n * a.rank + j];
    a.mats[{*role, m.layer}] = {std::move(pa_m), std::move(pb_m)};
  }
  st.adapters.emplace(name, std::move(a));
  return {};
}

result<void, driver_error> driver<serving>::unload_adapter(const std::string& name) {
  auto& st = *s_;
  const auto it = st.adapters.find(name);
  if (it == st.adapters.end()) return unexpected(driver_error{driver_error_code::unknown_adapter, "adapter '" + name + "' is not loaded"});
  for (const auto& [id, s] : st.seqs)
    if (s.phase != seq_phase::finished && s.req.adapter == name)
      return unexpected(driver_error{driver_error_code::adapter_busy, "adapter '" + name + "' is used by sequence " + std::to_string(id)});
  if (it->second.slot >= 0) st.slot_owner[static_cast<std::size_t>(it->second.slot)].clear();
  st.adapters.erase(it);
  return {};
}

std::vector<adapter_info> driver<serving>::adapters() const {
  std::vector<adapter_info> out;
  for (const auto& [name, a] : s_->adapters) out.push_back({name, a.path, a.rank, a.scale, a.slot, a.users});
  return out;
}

}  // namespace troupe::driver

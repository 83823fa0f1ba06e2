// The entries ledger: a driver's options checked, its weights loaded once, and every entry it serves
// traced and added before the first request (driver.hpp).
#include <algorithm>
#include <limits>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {

result<void, driver_error> driver_state::validate() {
  auto bad = [](std::string why) { return unexpected(driver_error{driver_error_code::bad_options, std::move(why)}); };
  const auto& o = options;
  if (o.max_rows < 1) return bad("max_rows must be at least 1");
  if (o.capacity < 1) return bad("capacity must be at least 1");
  const auto max_pos = handle->model().config().max_positions;
  if (max_pos > 0 && o.capacity > max_pos)
    return bad("capacity " + std::to_string(o.capacity) + " exceeds the model's " + std::to_string(max_pos) + " positions");
  if (o.prefill_chunk < 1 || o.prefill_chunk > o.capacity) return bad("prefill_chunk must lie in [1, capacity]");
  if (o.token_budget < o.max_rows) return bad("token_budget must cover a decode row per sequence (at least max_rows)");
  if (o.max_entries < 1) return bad("max_entries must be at least 1");
  if (o.smallest_chunk < 2) return bad("smallest_chunk must be at least 2");
  if (o.chain_steps < 1 || o.chain_steps > 1024) return bad("chain_steps must lie in [1, 1024]");
  if (o.paged) {
    if (o.block_size < 1 || o.block_size > o.capacity) return bad("block_size must lie in [1, capacity]");
    block_size = o.block_size;
    pool_blocks = o.pool_blocks > 0 ? o.pool_blocks : (o.max_rows * o.capacity + o.block_size - 1) / o.block_size;
  } else {
    if (o.pool_blocks != 0) return bad("pool_blocks applies to a paged pool only");
    block_size = o.capacity;
    pool_blocks = o.max_rows;
  }
  if (pool_blocks > std::numeric_limits<std::int32_t>::max() / std::max<std::int64_t>(block_size, 1))
    return bad("the pool holds more slots than a 32-bit KV map can address");
  const auto& sp = o.speculation;
  if (sp.kind != draft_kind::none) {
    if (sp.tokens < 1 || sp.tokens > 16) return bad("speculation.tokens must lie in [1, 16]");
    if (sp.tokens + 1 > o.capacity) return bad("a verify window of speculation.tokens + 1 must fit the capacity");
    if (sp.kind == draft_kind::ngram && (sp.ngram_min < 1 || sp.ngram_max < sp.ngram_min))
      return bad("speculation n-gram lengths must satisfy 1 <= ngram_min <= ngram_max");
    if (sp.kind == draft_kind::model && !sp.draft_model) return bad("a draft-model policy needs its checkpoint");
    if (sp.kind == draft_kind::mtp && !o.other_ranks.empty())
      return bad("MTP drafts run on a single rank (its draft program is not split across tensor-parallel ranks)");
  }
  // A recurrent model: its states are per sequence, not per block of tokens.
  const auto& st = handle->model().schema().states(families::program::step);
  recurrent = handle->model().schema().offers(families::program::step) &&
              std::any_of(st.begin(), st.end(), [](const families::state_decl& d) { return d.per_row; });
  if (recurrent) {
    // The table refuses the prefix cache with recurrent state: it is off for this model, not an error.
    options.prefix_cache = false;
    for (const auto& d : st) (d.per_row ? row_states : kv_states).push_back(d.name);
    snapshots = sp.kind != draft_kind::none;
    if (snapshots)
      for (const auto& r : o.other_ranks)
        if (!r.ex) return bad("drafts over recurrent state need every rank in this process (a rank's state snapshot is taken by its executor)");
  }
  const auto& ad = o.adapters;
  if (ad.slots < 0 || ad.slots > 64) return bad("adapters.slots must lie in [0, 64]");
  if (ad.slots > 0) {
    if (ad.max_rank < 1 || ad.max_rank > 256) return bad("adapters.max_rank must lie in [1, 256]");
    if (ad.targets.empty()) return bad("adapters.targets names no linear");
    for (auto t : ad.targets)
      if (!graph::lora_pools_of(t)) return bad("adapters.targets: " + std::string(graph::role_name(t)) + " is not a linear an adapter may target");
  }
  std::vector<feature> active;
  if (recurrent) active.push_back(feature::recurrent_state);
  if (ad.slots > 0) active.push_back(feature::adapter);
  if (!o.other_ranks.empty()) active.push_back(feature::placement);
  if (sp.kind != draft_kind::none) active.push_back(feature::draft_policy);
  if (o.paged) active.push_back(feature::paged_pool);
  if (o.prefix_cache) active.push_back(feature::prefix_cache);
  if (auto c = check_compatible(active))
    return unexpected(driver_error{driver_error_code::incompatible, "the driver's options do not compose", std::nullopt, *c});
  return {};
}

result<void, driver_error> driver_state::add(const entry_key& k) {
  if (entries.contains(k)) return {};
  // The head is an executor stage over the step's logits, not part of the traced graph: a key that
  // differs from a compiled one only in its head shares that entry instead of compiling a copy.
  entry_key twin = k;
  twin.head = k.head == head_kind::logits ? head_kind::sample : head_kind::logits;
  if (const auto it = entries.find(twin); it != entries.end()) {
    entries.emplace(k, it->second);
    slots_of.emplace(k, slots_of.at(twin));
    for (auto& r : ranks)
      if (!r.remote) r.entries.emplace(k, r.entries.at(twin));  // a remote rank keys entries without the head
    entry_order.push_back(k);
    return {};
  }
  if (static_cast<std::int64_t>(entries.size()) >= options.max_entries)
    return unexpected(driver_error{driver_error_code::entry_limit,
                                   "entry " + k.str() + " would pass the limit of " + std::to_string(options.max_entries) + " entries"});
  families::step_spec spec;
  spec.program = k.program;
  spec.shape = k.shape;
  spec.carried_inputs = k.carried;
  if (k.program == families::program::step) spec.lora = lora_spec();
  auto g = handle->model().trace(spec, options.limits);
  if (!g) return unexpected(driver_error{driver_error_code::prepare_failed, "trace of " + k.str() + ": " + g.error().message()});
  // Every slot resolved now: one the driver computes, or a refusal naming it before anything is compiled.
  std::vector<graph::slot> slots;
  for (const auto& b : g->slots()) {
    switch (b.slot.kind) {
      case graph::slot_kind::token_ids:
      case graph::slot_kind::positions:
      case graph::slot_kind::token_mask:
      case graph::slot_kind::kv_read_map:
      case graph::slot_kind::kv_write_map: break;
      case graph::slot_kind::hidden_states:
        if (k.program == families::program::draft) break;  // the MTP drafter hands the target's over
        [[fallthrough]];
      case graph::slot_kind::state_rows:
        if (recurrent) break;  // each sequence's row of the state pools
        [[fallthrough]];
      case graph::slot_kind::adapter_rows:
        if (options.adapters.slots > 0) break;  // each row's adapter slot
        [[fallthrough]];
      case graph::slot_kind::request_input:
        if (std::find(k.carried.begin(), k.carried.end(), b.slot.name) != k.carried.end()) break;  // bound from the rows' sequences
        [[fallthrough]];
      case graph::slot_kind::seq_lens:
        return unexpected(driver_error{driver_error_code::unbound_slot, "entry " + k.str() + ": slot '" + b.slot.name + "' (" +
                                                                           std::string(graph::slot_kind_name(b.slot.kind)) +
                                                                           ") is bound by no input this driver computes"});
    }
    slots.push_back(b.slot);
  }
  auto e = ex->add_entry(exe, *g);
  if (!e) return unexpected(driver_error{driver_error_code::prepare_failed, "entry " + k.str() + ": " + e.error().message()});
  if (options.max_retained_bytes > 0) {
    const auto m = ex->memory();
    const auto total = m.weight_bytes + m.state_bytes + m.scratch_bytes;
    if (total > options.max_retained_bytes) {
      // Not published: the driver never steps it. The executor keeps its compiled form until the
      // executable goes (the contract has no removal).
      return unexpected(driver_error{driver_error_code::byte_limit, "entry " + k.str() + " would retain " + std::to_string(total) +
                                                                        " bytes, past the bound of " + std::to_string(options.max_retained_bytes)});
    }
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    auto& r = ranks[i];
    if (r.remote) {
      if (auto a = r.remote->add(k); !a)
        return unexpected(driver_error{driver_error_code::prepare_failed, "entry " + k.str() + " on remote rank " + std::to_string(i + 1) + ": " + a.error()});
      continue;
    }
    auto rg = r.handle->model().trace(spec, options.limits);
    if (!rg) return unexpected(driver_error{driver_error_code::prepare_failed, "trace of " + k.str() + " on rank " + std::to_string(i + 1) + ": " + rg.error().message()});
    auto re = r.ex->add_entry(r.exe, *rg);
    if (!re) return unexpected(driver_error{driver_error_code::prepare_failed, "entry " + k.str() + " on rank " + std::to_string(i + 1) + ": " + re.error().message()});
    r.entries.emplace(k, *re);
  }
  entries.emplace(k, *e);
  slots_of.emplace(k, std::move(slots));
  entry_order.push_back(k);
  return {};
}

exec::step_inputs driver_state::bind(const entry_key& k, const step_values& v) const {
  exec::step_inputs in;
  for (const auto& s : slots_of.at(k)) {
    switch (s.kind) {
      case graph::slot_kind::token_ids: in.slots[s.name] = v.token_ids; break;
      case graph::slot_kind::positions: in.slots[s.name] = v.positions; break;
      case graph::slot_kind::token_mask: in.slots[s.name] = v.token_mask; break;
      case graph::slot_kind::kv_read_map: in.slots[s.name] = v.kv_read_map; break;
      case graph::slot_kind::kv_write_map: in.slots[s.name] = v.kv_write_map; break;
      case graph::slot_kind::hidden_states: in.slots[s.name] = v.hidden_states; break;
      case graph::slot_kind::state_rows: in.slots[s.name] = v.state_rows; break;
      case graph::slot_kind::adapter_rows: in.slots[s.name] = v.adapter_rows; break;
      case graph::slot_kind::request_input:
        if (auto t = carried_value(s.name, k.shape.rows(), k.shape.tokens(), v)) {
          in.slots[s.name] = t->view();
          in.owned.push_back(std::move(t));
        }
        break;
      default: break;  // refused when the entry was added
    }
  }
  // The other ranks' parts (another pipeline stage reads token ids this stage does not) take the
  // same inputs: every value the driver computed goes to them under its kind's name.
  if (!ranks.empty()) {
    const std::pair<graph::slot_kind, const tensor_view*> all[] = {{graph::slot_kind::token_ids, &v.token_ids},
                                                                   {graph::slot_kind::positions, &v.positions},
                                                                   {graph::slot_kind::token_mask, &v.token_mask},
                                                                   {graph::slot_kind::kv_read_map, &v.kv_read_map},
                                                                   {graph::slot_kind::kv_write_map, &v.kv_write_map},
                                                                   {graph::slot_kind::state_rows, &v.state_rows}};
    for (const auto& [kind, value] : all)
      if (value->data() != nullptr && (kind != graph::slot_kind::state_rows || recurrent))
        in.slots.try_emplace(std::string(graph::slot_kind_name(kind)), *value);
  }
  return in;
}

result<void, driver_error> driver_state::prepare() {
  if (auto v = validate(); !v) return v;
  const auto& cfg = handle->model().config();
  vocab = cfg.vocab;
  eos.assign(cfg.eos_ids.begin(), cfg.eos_ids.end());
  if (const auto* t = handle->text())
    for (auto id : t->specials().end_ids) eos.push_back(static_cast<std::int32_t>(id));
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());

  row_buckets = buckets(1, options.max_rows);
  chunk_buckets = buckets(std::min<std::int64_t>(options.smallest_chunk, options.prefill_chunk), options.prefill_chunk);
  std::vector<head_kind> heads{head_kind::sample};
  if (options.logits_head) heads.push_back(head_kind::logits);
  // An encoder (BERT) offers the encode program only: the driver serves embeddings and refuses generation.
  const auto& schema = handle->model().schema();
  const bool generates = schema.offers(families::program::step);
  if (!generates) heads.clear();
  const bool speculate = generates && options.speculation.kind != draft_kind::none;
  const bool mtp = speculate && options.speculation.kind == draft_kind::mtp;
  if (mtp) {
    if (!schema.offers(families::program::draft))
      return unexpected(driver_error{driver_error_code::program_not_offered,
                                     "MTP speculation: the model has no multi-token-prediction layer (no draft program)"});
    carry_hidden = true;  // every step entry hands the drafter its hidden states
  }
  std::vector<entry_key> keys;
  for (auto h : heads) {
    for (auto r : row_buckets) keys.push_back(step_key(r, 1, h));
    for (auto t : chunk_buckets)
      if (t > 1) keys.push_back(step_key(1, t, h));
  }
  if (speculate) {
    const auto K1 = options.speculation.tokens + 1;
    for (std::int64_t w : {2, 3, 5, 9, 17})
      if (w < K1) verify_widths.push_back(w);
    verify_widths.push_back(K1);
    for (auto w : verify_widths)
      for (auto r : row_buckets) keys.push_back(verify_key(r, w));
  }
  if (mtp) {
    // Catching up a decode or a verify (one token, or a window of up to K + 1) over every row bucket;
    // a prefill's catch-up one row at a time in the chunk sizes.
    for (auto r : row_buckets)
      for (std::int64_t t : {std::int64_t{1}, options.speculation.tokens + 1}) keys.push_back(draft_key(r, t));
    for (auto t : chunk_buckets)
      if (t > options.speculation.tokens + 1) keys.push_back(draft_key(1, t));
  }
  if (options.encode || !generates) {
    if (!schema.offers(families::program::encode))
      return unexpected(driver_error{driver_error_code::program_not_offered, "the model offers no encode program"});
    keys.push_back(encode_key());
  }
  const auto total = static_cast<std::int64_t>(keys.size()) + 1;
  std::int64_t done = 0;
  auto progress = [&] {
    if (options.on_prepare) options.on_prepare(done, total);
  };
  progress();

  if (options.connect)
    if (auto c = options.connect(); !c) return unexpected(driver_error{driver_error_code::prepare_failed, "joining the replica's ranks: " + c.error()});
  weights = std::make_unique<weight_map_source>(handle->model().weights());
  if (auto p = make_adapter_pools(); !p) return p;
  auto exe_or = ex->load(*weights);
  if (!exe_or) return unexpected(driver_error{driver_error_code::prepare_failed, "load: " + exe_or.error().message()});
  exe = *exe_or;
  for (std::size_t i = 0; i < options.other_ranks.size(); ++i) {
    const auto& o = options.other_ranks[i];
    if (!o.remote && (!o.shard || o.ex == nullptr))
      return unexpected(driver_error{driver_error_code::bad_options, "tensor-parallel rank " + std::to_string(i + 1) + " has no shard or executor"});
    rank_state r;
    if (o.remote) {
      r.remote = o.remote;
      if (auto l = r.remote->load(); !l)
        return unexpected(driver_error{driver_error_code::prepare_failed, "load on remote rank " + std::to_string(i + 1) + ": " + l.error()});
      ranks.push_back(std::move(r));
      continue;
    }
    r.handle = o.shard;
    r.ex = o.ex;
    r.weights = std::make_unique<weight_map_source>(r.handle->model().weights());
    auto re = r.ex->load(*r.weights);
    if (!re) return unexpected(driver_error{driver_error_code::prepare_failed, "load on rank " + std::to_string(i + 1) + ": " + re.error().message()});
    r.exe = *re;
    ranks.push_back(std::move(r));
  }
  ++done;
  progress();
  for (const auto& k : keys) {
    if (auto a = add(k); !a) return a;
    ++done;
    progress();
  }
  pool.emplace(static_cast<std::int32_t>(pool_blocks), static_cast<std::int32_t>(block_size));
  free_state_rows.clear();
  for (auto r = recurrent ? options.max_rows : 0; r-- > 0;) free_state_rows.push_back(static_cast<std::int32_t>(r));  // snapshots: r + max_rows
  counters.pool_blocks = pool_blocks;
  if (speculate) {
    if (options.speculation.kind == draft_kind::ngram) {
      drafts = make_ngram_drafter(options.speculation);
    } else if (mtp) {
      auto d = make_mtp_drafter(*this);
      if (!d) return unexpected(d.error());
      drafts = std::move(*d);
    } else {
      auto o = options;
      if (!o.speculation.draft_executor) o.speculation.draft_executor = ex;
      auto d = make_model_drafter(o, vocab);
      if (!d) return unexpected(d.error());
      drafts = std::move(*d);
    }
  }
  return {};
}

}  // namespace troupe::driver

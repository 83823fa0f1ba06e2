// The scheduler: one round of continuous batching over the serving surface. Waiting sequences are
// admitted while rows are free, decoding sequences advance together (one token each, or a verify
// window of drafts), prefilling sequences advance by chunks while the token budget lasts.
#include <algorithm>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {

// ---- sequences --------------------------------------------------------------------------------------

void driver_state::free_blocks(sequence& s) {
  for (auto b : s.blocks) pool->release(b);
  s.blocks.clear();
  s.chain.clear();
  s.computed = 0;
}

void driver_state::finish(sequence& s, finish_reason r) {
  if (s.phase == seq_phase::finished) return;
  s.finished = r;
  s.phase = seq_phase::finished;
  free_blocks(s);
  running.erase(std::remove(running.begin(), running.end(), s.id), running.end());
  waiting.erase(std::remove(waiting.begin(), waiting.end(), s.id), waiting.end());
  ex->close_history(s.id);
}

result<void, driver_error> driver_state::admit(sequence& s) {
  s.phase = seq_phase::running;
  s.admitted = next_admission++;
  running.push_back(s.id);
  const bool first = s.cached < 0;  // a preempted sequence admitted again finds its own blocks: not counted
  if (first) s.cached = 0;
  if (!options.prefix_cache || !s.cacheable) return {};
  // Share cached blocks for the longest cached chain of full blocks, leaving at least the last token
  // to compute (its logits give the next pick).
  const std::int64_t bs = block_size;
  const std::int64_t full = (static_cast<std::int64_t>(s.tokens.size()) - 1) / bs;
  std::uint64_t parent = root_hash;
  for (std::int64_t b = 0; b < full; ++b) {
    const std::span<const std::int32_t> toks(s.tokens.data() + b * bs, static_cast<std::size_t>(bs));
    const auto h = chain_hash(parent, toks);
    auto hit = pool->lookup(h, parent, toks);
    if (!hit) break;
    s.blocks.push_back(*hit);
    s.chain.push_back(h);
    s.computed += bs;
    counters.prefix_hit_tokens += bs;
    if (first) s.cached = std::min(s.computed, s.prompt_len);
    parent = h;
  }
  return {};
}

// Blocks for positions [0, upto). Preempts the latest admitted other sequence when the pool is dry
// (preemption on); false when the blocks cannot be had.
bool driver_state::ensure_blocks(sequence& s, std::int64_t upto, step_report& report) {
  const std::int64_t need = (upto + block_size - 1) / block_size;
  while (static_cast<std::int64_t>(s.blocks.size()) < need) {
    if (auto b = pool->allocate()) {
      s.blocks.push_back(*b);
      continue;
    }
    if (!options.preempt) return false;
    sequence* victim = nullptr;
    for (auto id : running) {
      auto& o = seqs.at(id);
      if (o.id != s.id && !o.blocks.empty() && (!victim || o.admitted > victim->admitted)) victim = &o;
    }
    if (!victim) return false;
    free_blocks(*victim);
    victim->phase = seq_phase::waiting;
    running.erase(std::remove(running.begin(), running.end(), victim->id), running.end());
    waiting.push_front(victim->id);
    ++report.preempted;
    ++counters.preemptions;
  }
  return true;
}

void driver_state::publish_full_blocks(sequence& s) {
  if (!options.prefix_cache || !s.cacheable) return;
  const std::int64_t bs = block_size;
  while (static_cast<std::int64_t>(s.chain.size()) < s.computed / bs) {
    const auto b = static_cast<std::int64_t>(s.chain.size());
    const std::span<const std::int32_t> toks(s.tokens.data() + b * bs, static_cast<std::size_t>(bs));
    const auto parent = b == 0 ? root_hash : s.chain.back();
    const auto h = chain_hash(parent, toks);
    const auto blk = s.blocks[static_cast<std::size_t>(b)];
    if (!pool->published(blk)) (void)pool->publish(blk, h, parent, toks);
    s.chain.push_back(h);
  }
}

void driver_state::accept(sequence& s, const exec::sampled_row& row, seq_update& u) {
  const auto tok = row.pick.token;
  s.tokens.push_back(tok);
  ++s.generated;
  u.tokens.push_back(tok);
  u.picks.push_back(row.pick);
  if (!row.logits.empty()) u.logits.push_back(row.logits);
  if (s.detok) {
    auto out = s.detok->push(tok);
    u.text += out.text;
    if (out.stop) {
      finish(s, finish_reason::stop_string);
      return;
    }
  }
  const bool is_eos = !s.req.ignore_eos && std::binary_search(eos.begin(), eos.end(), tok);
  if (is_eos || std::find(s.stop_ids.begin(), s.stop_ids.end(), tok) != s.stop_ids.end()) {
    finish(s, finish_reason::eos);
  } else if (s.generated >= s.req.max_tokens) {
    finish(s, finish_reason::length);
  } else if (static_cast<std::int64_t>(s.tokens.size()) > options.capacity) {
    finish(s, finish_reason::capacity);
  }
  if (s.finished && s.detok && *s.finished != finish_reason::stop_string) u.text += s.detok->finish().text;
}

exec::mask_hook driver_state::mask_hook_for(const std::vector<sequence*>& rows) const {
  bool any = false;
  for (auto* s : rows) any = any || static_cast<bool>(s->req.guide);
  if (!any) return {};
  const auto words = static_cast<std::size_t>((vocab + 31) / 32);
  return [rows, words](std::vector<std::vector<std::uint32_t>>& masks) {
    for (std::size_t r = 0; r < rows.size() && r < masks.size(); ++r) {
      const auto* s = rows[r];
      if (!s->req.guide) continue;
      masks[r].assign(words, 0u);
      const std::span<const std::int32_t> out(s->tokens.data() + s->prompt_len, s->tokens.size() - static_cast<std::size_t>(s->prompt_len));
      s->req.guide(out, masks[r]);
    }
  };
}

result<void, driver_error> driver_state::run_decode(std::vector<sequence*>& rows, step_report& report,
                                                    std::map<seq_id, seq_update>& updates) {
  const auto D = static_cast<std::int64_t>(rows.size());
  const auto R = *std::lower_bound(row_buckets.begin(), row_buckets.end(), D);
  const auto C = options.capacity;
  bool want_logits = false;
  for (auto* s : rows) want_logits = want_logits || s->req.head == head_kind::logits;
  const auto key = step_key(R, 1, want_logits ? head_kind::logits : head_kind::sample);
  const auto entry = entries.at(key);

  tensor ids(dtype::i32, {R}), pos(dtype::i32, {R}), write(dtype::i32, {R}), read(dtype::i32, {R, C});
  auto* idp = ids.as<std::int32_t>();
  auto* pp = pos.as<std::int32_t>();
  auto* wp = write.as<std::int32_t>();
  auto* rp = read.as<std::int32_t>();
  std::fill(idp, idp + R, 0);
  std::fill(pp, pp + R, 0);
  std::fill(wp, wp + R, -1);
  std::fill(rp, rp + R * C, -1);
  std::vector<exec::sample_row_request> heads;
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    const std::int64_t p = s.computed;
    idp[r] = s.tokens[static_cast<std::size_t>(p)];
    pp[r] = static_cast<std::int32_t>(p);
    wp[r] = static_cast<std::int32_t>(s.blocks[static_cast<std::size_t>(p / block_size)] * block_size + p % block_size);
    for (std::int64_t j = 0; j <= p; ++j)
      rp[r * C + j] = static_cast<std::int32_t>(s.blocks[static_cast<std::size_t>(j / block_size)] * block_size + j % block_size);
    heads.push_back({s.id, s.req.sampling, static_cast<std::uint64_t>(s.generated), s.req.head == head_kind::logits});
  }
  exec::step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", write.view()}, {"kv_read_map", read.view()}};
  std::optional<others_run> others;
  if (!ranks.empty()) others.emplace(rank_threads(), key, in);
  auto picks = ex->step_sample(entry, in, heads, mask_hook_for(rows));
  if (others)
    if (auto e = others->wait(); e && picks) picks = unexpected(*e);
  ++report.executor_steps;
  if (!picks) {
    for (auto* s : rows) {
      finish(*s, finish_reason::error);
      updates[s->id].finished = finish_reason::error;
    }
    return unexpected(driver_error{driver_error_code::step_failed, "decode step " + key.str() + ": " + picks.error().message()});
  }
  report.decode_rows += D;
  counters.decode_tokens += D;
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    ++s.computed;
    publish_full_blocks(s);
    auto& u = updates[s.id];
    u.id = s.id;
    accept(s, (*picks)[static_cast<std::size_t>(r)], u);
  }
  return {};
}

result<void, driver_error> driver_state::run_prefill(sequence& s, std::int64_t n, step_report& report, std::map<seq_id, seq_update>& updates) {
  const auto T = *std::lower_bound(chunk_buckets.begin(), chunk_buckets.end(), n);
  const auto C = options.capacity;
  const std::int64_t pending = static_cast<std::int64_t>(s.tokens.size()) - s.computed;
  const bool last = n == pending;
  const bool want_logits = last && s.req.head == head_kind::logits;
  const auto key = step_key(1, T, want_logits ? head_kind::logits : head_kind::sample);
  const auto entry = entries.at(key);
  tensor ids(dtype::i32, {T}), pos(dtype::i32, {T}), write(dtype::i32, {T}), read(dtype::i32, {1, C});
  auto* idp = ids.as<std::int32_t>();
  auto* pp = pos.as<std::int32_t>();
  auto* wp = write.as<std::int32_t>();
  auto* rp = read.as<std::int32_t>();
  const std::int64_t pad = T - n;  // at the front, so the row's last token is real
  auto slot = [&](std::int64_t p) { return static_cast<std::int32_t>(s.blocks[static_cast<std::size_t>(p / block_size)] * block_size + p % block_size); };
  for (std::int64_t t = 0; t < T; ++t) {
    if (t < pad) {
      idp[t] = 0;
      pp[t] = 0;
      wp[t] = -1;
      continue;
    }
    const std::int64_t p = s.computed + t - pad;
    idp[t] = s.tokens[static_cast<std::size_t>(p)];
    pp[t] = static_cast<std::int32_t>(p);
    wp[t] = slot(p);
  }
  const std::int64_t end = s.computed + n;
  for (std::int64_t j = 0; j < C; ++j) rp[j] = j < end ? slot(j) : -1;
  exec::step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", write.view()}, {"kv_read_map", read.view()}};
  ++report.executor_steps;
  result<std::vector<exec::sampled_row>, exec::exec_error> picks = std::vector<exec::sampled_row>{};
  std::optional<others_run> others;
  if (!ranks.empty()) others.emplace(rank_threads(), key, in);
  if (last) {
    const exec::sample_row_request head{s.id, s.req.sampling, static_cast<std::uint64_t>(s.generated), want_logits};
    std::vector<sequence*> one{&s};
    picks = ex->step_sample(entry, in, std::span(&head, 1), mask_hook_for(one));
  } else {
    auto out = ex->step(entry, in);
    if (!out) picks = unexpected(out.error());
  }
  if (others)
    if (auto e = others->wait(); e && picks) picks = unexpected(*e);
  if (!picks) {
    finish(s, finish_reason::error);
    updates[s.id].id = s.id;
    updates[s.id].finished = finish_reason::error;
    return unexpected(driver_error{driver_error_code::step_failed, "prefill step " + key.str() + ": " + picks.error().message()});
  }
  s.computed = end;
  report.prefill_tokens += n;
  counters.prefill_tokens += n;
  publish_full_blocks(s);
  if (last) {
    auto& u = updates[s.id];
    u.id = s.id;
    accept(s, picks->front(), u);
  }
  return {};
}

result<step_report, driver_error> driver_state::round() {
  step_report report;
  std::map<seq_id, seq_update> updates;
  ++counters.rounds;

  // Cancellations take effect first.
  for (auto& [id, s] : seqs)
    if (s.cancel && s.phase != seq_phase::finished) finish(s, finish_reason::cancelled);

  // Admission, first come first served (preempted sequences were put back at the front).
  // A sequence is admitted only while the pool can hold all its tokens so far and the next one, so
  // a preempted sequence does not come straight back to take blocks from the rows that preempted it.
  while (!waiting.empty() && static_cast<std::int64_t>(running.size()) < options.max_rows) {
    auto& s = seqs.at(waiting.front());
    const auto need = (static_cast<std::int64_t>(s.tokens.size()) + block_size) / block_size;
    if (!running.empty() && pool->available() < need) break;
    waiting.pop_front();
    if (auto a = admit(s); !a) return unexpected(a.error());
  }

  // Decode rows: running sequences with exactly their last pick pending.
  std::vector<sequence*> decode;
  for (auto id : std::vector<seq_id>(running)) {
    auto& s = seqs.at(id);
    if (s.phase != seq_phase::running) continue;
    if (static_cast<std::int64_t>(s.tokens.size()) - s.computed != 1) continue;
    if (!ensure_blocks(s, s.computed + 1, report)) {
      finish(s, finish_reason::pool_exhausted);
      continue;
    }
    decode.push_back(&s);
  }
  // A preemption may have taken rows already chosen.
  std::erase_if(decode, [](sequence* s) { return s->phase != seq_phase::running || s->blocks.empty(); });
  result<void, driver_error> failure{};
  if (!decode.empty()) failure = run_decode(decode, report, updates);

  // Prefill chunks while the budget lasts.
  std::int64_t budget = options.token_budget - static_cast<std::int64_t>(decode.size());
  if (failure) {
    for (auto id : std::vector<seq_id>(running)) {
      if (budget <= 0) break;
      auto it = seqs.find(id);
      if (it == seqs.end() || it->second.phase != seq_phase::running) continue;
      auto& s = it->second;
      const std::int64_t pending = static_cast<std::int64_t>(s.tokens.size()) - s.computed;
      if (pending <= 1) continue;  // a decode row (or done)
      const std::int64_t n = std::min({pending, options.prefill_chunk, budget});
      if (!ensure_blocks(s, s.computed + n, report)) {
        finish(s, finish_reason::pool_exhausted);
        updates[s.id].id = s.id;
        continue;
      }
      if (s.phase != seq_phase::running) continue;
      if (auto r = run_prefill(s, n, report, updates); !r) {
        failure = r;
        break;
      }
      budget -= n;
    }
  }

  // Finishes of this round (and of earlier cancellations) are reported once.
  for (auto& [id, s] : seqs) {
    if (s.phase == seq_phase::finished && !s.reported) {
      auto& u = updates[id];
      u.id = id;
      u.finished = s.finished;
      u.cached_tokens = std::max<std::int64_t>(s.cached, 0);
      s.reported = true;
    }
  }
  counters.executor_steps += report.executor_steps;
  counters.pool_available = pool->available();
  for (auto& [id, u] : updates) report.updates.push_back(std::move(u));
  if (!failure) return unexpected(failure.error());
  return report;
}

}  // namespace troupe::driver

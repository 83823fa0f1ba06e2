// The scheduler: one round of continuous batching over the serving surface. Waiting sequences are
// admitted while rows are free, decoding sequences advance together (one token each, or a verify
// window of drafts), prefilling sequences advance by chunks while the token budget lasts.
#include <algorithm>
#include <chrono>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {

namespace {
// Adds the time from here to the end of the scope to `acc` (the host/executor split of a round).
struct timed {
  double& acc;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~timed() { acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};
}  // namespace

// ---- sequences --------------------------------------------------------------------------------------

void driver_state::free_blocks(sequence& s) {
  release_adapter(s);  // a readmission takes a slot again
  if (s.state_row >= 0) {  // its recurrent state goes with its blocks: a readmission recomputes it from position 0
    free_state_rows.push_back(s.state_row);
    s.state_row = -1;
  }
  for (auto b : s.blocks) pool->release(b);
  s.blocks.clear();
  s.chain.clear();
  s.computed = 0;
}

void driver_state::finish(sequence& s, finish_reason r) {
  if (s.phase == seq_phase::finished) return;
  if (groups.contains(s.id)) {  // a beam search ended from outside (cancel, error): its forks go with it
    std::map<seq_id, seq_update> ignored;
    end_beams(s, ignored);  // finishes s with its best hypothesis so far
    s.finished = r;
    return;
  }
  s.finished = r;
  s.phase = seq_phase::finished;
  free_blocks(s);
  running.erase(std::remove(running.begin(), running.end(), s.id), running.end());
  waiting.erase(std::remove(waiting.begin(), waiting.end(), s.id), waiting.end());
  ex->close_history(s.id);
  if (drafts) drafts->forget(s.id);
}

void driver_state::truncate(sequence& s, std::int64_t length) {
  if (length >= static_cast<std::int64_t>(s.tokens.size())) return;
  s.tokens.resize(static_cast<std::size_t>(length));
  s.computed = std::min(s.computed, length);
  s.chain.resize(std::min(s.chain.size(), static_cast<std::size_t>(s.computed / block_size)));
  s.prompt_len = std::min(s.prompt_len, length);
  s.generated = std::max<std::int64_t>(0, length - s.prompt_len);
}

result<void, driver_error> driver_state::admit(sequence& s) {
  s.phase = seq_phase::running;
  s.admitted = next_admission++;
  running.push_back(s.id);
  const bool first = s.cached < 0;  // a preempted sequence admitted again finds its own blocks: not counted
  if (first) s.cached = 0;
  if (recurrent && s.state_row < 0) {
    // Admission keeps running rows under max_rows, and every running sequence holds one state row.
    if (free_state_rows.empty()) return unexpected(driver_error{driver_error_code::step_failed, "no recurrent state row is free"});
    s.state_row = free_state_rows.back();
    free_state_rows.pop_back();
  }
  if (!options.prefix_cache || !s.cacheable) return {};
  // Share cached blocks for the longest cached chain of full blocks, leaving at least the last token
  // to compute (its logits give the next pick).
  const std::int64_t bs = block_size;
  const std::int64_t full = (static_cast<std::int64_t>(s.tokens.size()) - 1) / bs;
  std::uint64_t parent = root_of(s);
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
      if (o.id != s.id && !o.blocks.empty() && o.group == 0 && (!victim || o.admitted > victim->admitted)) victim = &o;
    }
    if (!victim) return false;
    free_blocks(*victim);
    if (drafts) drafts->forget(victim->id);  // its draft mirror's row and blocks too; a new one starts on readmission
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
    const auto parent = b == 0 ? root_of(s) : s.chain.back();
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

void driver_state::hand_hidden(const exec::step_outputs& out, const sequence& s, std::int64_t at, std::int64_t first, std::int64_t count) {
  if (!drafts || !drafts->wants_hidden() || count < 1) return;
  const auto it = out.outputs.find("hidden");
  if (it == out.outputs.end() || it->second.type() != dtype::f32 || it->second.shape().rank() != 2 || it->second.shape()[0] < at + count) return;
  drafts->observe(s.id, first, it->second.as<float>() + at * it->second.shape()[1], count);
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

  step_maps m(R, 1, C);
  auto* idp = m.ids.as<std::int32_t>();
  auto* pp = m.pos.as<std::int32_t>();
  auto* wp = m.write.as<std::int32_t>();
  auto* rp = m.read.as<std::int32_t>();
  std::vector<exec::sample_row_request> heads;
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    const std::int64_t p = s.computed;
    idp[r] = s.tokens[static_cast<std::size_t>(p)];
    pp[r] = static_cast<std::int32_t>(p);
    wp[r] = slot_of(s, p);
    m.row_of(r, s);
    for (std::int64_t j = 0; j <= p; ++j) rp[r * C + j] = slot_of(s, j);
    heads.push_back({s.id, s.req.sampling, static_cast<std::uint64_t>(s.generated), s.req.head == head_kind::logits});
  }
  const auto in = bind(key, m.values());
  std::optional<others_run> others;
  if (!ranks.empty()) others.emplace(rank_threads(), key, in);
  exec::step_outputs rest;
  auto picks = [&] {
    timed t{counters.executor_seconds};
    return ex->step_sample(entry, in, heads, mask_hook_for(rows), carry_hidden ? &rest : nullptr);
  }();
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
  // Beams are picked as a group once every row has its pick (beam_step may end forks).
  std::map<seq_id, std::vector<exec::sample_pick>> beam_picks;
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    hand_hidden(rest, s, r, s.computed, 1);
    ++s.computed;
    publish_full_blocks(s);
    if (s.group != 0) {
      auto& g = groups.at(s.group);
      auto& v = beam_picks[s.group];
      v.resize(g.live.size());
      const auto at = std::find(g.live.begin(), g.live.end(), s.id) - g.live.begin();
      v[static_cast<std::size_t>(at)] = std::move((*picks)[static_cast<std::size_t>(r)].pick);
      continue;
    }
    auto& u = updates[s.id];
    u.id = s.id;
    accept(s, (*picks)[static_cast<std::size_t>(r)], u);
  }
  for (auto& [head, v] : beam_picks)
    if (auto b = beam_step(head, v, updates); !b) return b;
  return {};
}

bool driver_state::chainable(const std::vector<sequence*>& rows) const {
  if (options.chain_steps < 2 || !ranks.empty() || drafts || !waiting.empty()) return false;
  if (rows.size() != running.size()) return false;  // someone prefills: it needs the next round
  for (const auto* s : rows)
    if (s->req.guide || !s->req.stop.empty() || s->req.head != head_kind::sample || s->group != 0 || s->limit >= 0) return false;
  return true;
}

result<bool, driver_error> driver_state::run_chain(std::vector<sequence*>& rows, step_report& report, std::map<seq_id, seq_update>& updates) {
  std::int64_t n = options.chain_steps;
  for (const auto* s : rows)
    n = std::min({n, s->req.max_tokens - s->generated, options.capacity - static_cast<std::int64_t>(s->tokens.size())});
  if (n < 2) return false;
  for (auto* s : rows)
    if (!ensure_blocks(*s, s->computed + n, report)) return false;  // the next round decodes them one step at a time
  if (std::any_of(rows.begin(), rows.end(), [](const sequence* s) { return s->phase != seq_phase::running || s->blocks.empty(); })) return false;
  const auto D = static_cast<std::int64_t>(rows.size());
  const auto R = *std::lower_bound(row_buckets.begin(), row_buckets.end(), D);
  const auto C = options.capacity;
  const auto key = step_key(R, 1, head_kind::sample);
  step_maps m(R, 1, C);
  exec::chain_request chain;
  chain.steps = n;
  chain.positions.assign(static_cast<std::size_t>(n * R), 0);
  chain.write_slots.assign(static_cast<std::size_t>(n * R), -1);
  std::vector<exec::sample_row_request> heads;
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    const std::int64_t p = s.computed;
    m.ids.as<std::int32_t>()[r] = s.tokens[static_cast<std::size_t>(p)];
    m.pos.as<std::int32_t>()[r] = static_cast<std::int32_t>(p);
    m.write.as<std::int32_t>()[r] = slot_of(s, p);
    m.row_of(r, s);
    // Every slot the chain writes is in the read map from the start; the causal mask hides the later ones.
    for (std::int64_t j = 0; j < p + n; ++j) m.read.as<std::int32_t>()[r * C + j] = slot_of(s, j);
    for (std::int64_t i = 0; i < n; ++i) {
      chain.positions[static_cast<std::size_t>(i * R + r)] = static_cast<std::int32_t>(p + i);
      chain.write_slots[static_cast<std::size_t>(i * R + r)] = slot_of(s, p + i);
    }
    std::vector<std::int32_t> stops = s.stop_ids;
    if (!s.req.ignore_eos) stops.insert(stops.end(), eos.begin(), eos.end());
    chain.stop_ids.push_back(std::move(stops));
    heads.push_back({s.id, s.req.sampling, static_cast<std::uint64_t>(s.generated), false});
  }
  const auto in = bind(key, m.values());
  auto picks = [&] {
    timed t{counters.executor_seconds};
    return ex->step_chain(entries.at(key), in, heads, chain);
  }();
  if (!picks) {
    for (auto* s : rows) {
      finish(*s, finish_reason::error);
      updates[s->id].id = s->id;
      updates[s->id].finished = finish_reason::error;
    }
    return unexpected(driver_error{driver_error_code::step_failed, "chained decode " + key.str() + ": " + picks.error().message()});
  }
  report.executor_steps += static_cast<std::int64_t>(picks->size());
  counters.chained_steps += static_cast<std::int64_t>(picks->size());
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    auto& u = updates[s.id];
    u.id = s.id;
    for (const auto& step : *picks) {
      if (s.phase != seq_phase::running) break;
      ++s.computed;
      publish_full_blocks(s);
      accept(s, step[static_cast<std::size_t>(r)], u);
      ++report.decode_rows;
      ++counters.decode_tokens;
    }
  }
  return true;
}

result<std::vector<std::vector<std::int32_t>>, driver_error> driver_state::draft_for(const std::vector<sequence*>& rows) {
  if (!drafts) return std::vector<std::vector<std::int32_t>>{};
  const auto K = options.speculation.tokens;
  std::vector<draft_row> asks;
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& s = *rows[i];
    if (!drafts_for(s)) continue;
    if (s.pause > 0) {  // the back-off of adaptive speculation
      --rows[i]->pause;
      continue;
    }
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    const std::int64_t want = std::min({s.window > 0 ? s.window : K, s.req.max_tokens - s.generated - 1, options.capacity - n});
    if (want < 1) continue;
    asks.push_back({s.id, s.tokens, want});
    which.push_back(i);
  }
  if (asks.empty()) return std::vector<std::vector<std::int32_t>>{};
  auto got = drafts->propose(asks);
  counters.draft_steps = drafts->steps();
  if (!got) return unexpected(got.error());
  std::vector<std::vector<std::int32_t>> out(rows.size());
  bool any = false;
  for (std::size_t j = 0; j < which.size(); ++j) {
    auto& d = (*got)[j];
    for (auto t : d)
      if (t < 0 || t >= vocab) d.clear();  // a draft outside the vocabulary is no draft
    any = any || !d.empty();
    out[which[j]] = std::move(d);
  }
  if (!any) out.clear();
  return out;
}

bool driver_state::drafts_for(const sequence& s) { return s.req.speculate && !s.req.guide && s.req.head == head_kind::sample; }

void driver_state::prime_drafts(const std::vector<sequence*>& prefilled) {
  std::vector<draft_row> rows;
  for (const auto* s : prefilled) {
    if (s->phase != seq_phase::running || !drafts_for(*s) || s->tokens.size() < 2) continue;
    const std::span<const std::int32_t> all(s->tokens);
    rows.push_back({s->id, all.first(all.size() - 1), 1});
  }
  if (!rows.empty()) drafts->prime(rows);
  counters.draft_steps = drafts->steps();
}

result<void, driver_error> driver_state::run_verify(std::vector<sequence*>& rows, const std::vector<std::vector<std::int32_t>>& drafts_of,
                                                    step_report& report, std::map<seq_id, seq_update>& updates) {
  // Blocks for every draft position; a row whose drafts cannot have them verifies none.
  std::vector<std::vector<std::int32_t>> drafted = drafts_of;
  for (std::size_t r = 0; r < rows.size(); ++r)
    if (!drafted[r].empty() && !ensure_blocks(*rows[r], rows[r]->computed + 1 + static_cast<std::int64_t>(drafted[r].size()), report))
      drafted[r].clear();
  for (std::size_t r = rows.size(); r-- > 0;)  // a preemption may have taken rows already chosen
    if (rows[r]->phase != seq_phase::running || rows[r]->blocks.empty()) {
      rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(r));
      drafted.erase(drafted.begin() + static_cast<std::ptrdiff_t>(r));
    }
  if (rows.empty()) return {};
  const auto D = static_cast<std::int64_t>(rows.size());
  const auto R = *std::lower_bound(row_buckets.begin(), row_buckets.end(), D);
  std::size_t longest = 0;
  for (const auto& d : drafted) longest = std::max(longest, d.size());
  const auto T = *std::lower_bound(verify_widths.begin(), verify_widths.end(), static_cast<std::int64_t>(longest) + 1);
  const auto key = verify_key(R, T);
  step_maps maps(R, T, options.capacity);
  for (std::int64_t r = 0; r < D; ++r) {
    const auto& s = *rows[static_cast<std::size_t>(r)];
    window_row(maps, r, s, s.computed, drafted[static_cast<std::size_t>(r)]);
  }
  auto fail = [&](const std::string& why) {
    for (auto* s : rows) {
      finish(*s, finish_reason::error);
      updates[s->id].id = s->id;
      updates[s->id].finished = finish_reason::error;
    }
    return unexpected(driver_error{driver_error_code::step_failed, "verify step " + key.str() + ": " + why});
  };
  // Recurrent state: the window advances it past every draft, so each drafting row's state is kept
  // first (row r + max_rows) for a rejection to return to.
  if (snapshots) {
    std::vector<std::pair<std::int64_t, std::int64_t>> keep;
    for (std::int64_t r = 0; r < D; ++r)
      if (!drafted[static_cast<std::size_t>(r)].empty()) {
        const auto row = rows[static_cast<std::size_t>(r)]->state_row;
        keep.emplace_back(row, row + options.max_rows);
      }
    if (auto c = copy_row_states(keep); !c) return fail(c.error().message());
  }
  auto out = step_everywhere(key, bind(key, maps.values()));
  ++report.executor_steps;
  ++counters.verify_steps;
  if (!out) return fail(out.error().message());
  const auto it = out->outputs.find("logits");
  if (it == out->outputs.end() || it->second.shape().rank() != 2 || it->second.shape()[0] != R * T) return fail("no logits for every token of the window");
  const auto V = it->second.shape()[1];
  const float* logits = it->second.as<float>();
  const auto K = options.speculation.tokens;
  std::vector<replay_row> replay;  // rows whose state must come back
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    const auto& d = drafted[static_cast<std::size_t>(r)];
    const auto k = static_cast<std::int64_t>(d.size());
    // Each position's pick as the sequence would draw it without drafts: its rules, its history with
    // the tokens accepted before it, its draw index.
    // Penalties read the tokens accepted before each position: a copy of the history takes them.
    // Without penalties the history's bias is all it gives, and the executor's own serves as it is.
    const auto& sp = s.req.sampling;
    const auto* kept = ex->history(s.id);
    std::optional<exec::token_history> own;
    if (kept && (sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f)) own = *kept;
    const exec::token_history* hist = own ? &*own : kept;
    std::vector<exec::sample_pick> picks;
    std::int64_t m = 0;
    for (std::int64_t i = 0; i <= k; ++i) {
      const std::span<const float> row(logits + (r * T + i) * V, static_cast<std::size_t>(V));
      auto pick = exec::sample_row(row, sp, hist, static_cast<std::uint64_t>(s.generated + i), {}, verify_scratch);
      if (!pick) return fail("row " + std::to_string(r) + ": " + pick.error().message());
      if (own) own->record(pick->token);
      const bool agrees = i < k && pick->token == d[static_cast<std::size_t>(i)];
      picks.push_back(std::move(*pick));
      if (!agrees) break;
      ++m;
    }
    report.draft_tokens += k;
    report.accepted_tokens += m;
    counters.draft_tokens += k;
    counters.accepted_tokens += m;
    counters.decode_tokens += m + 1;
    if (options.speculation.adaptive) {
      s.window = m == k ? std::min(K, k + 1) : std::max<std::int64_t>(1, m + 1);
      // Drafts that never land cost a verify window each (and a state replay on a recurrent model):
      // after three such windows in a row, decode without drafting for a while, longer each time.
      if (k > 0) s.misses = m == 0 ? s.misses + 1 : 0;
      if (s.misses >= 3) s.pause = std::int64_t{1} << std::min<std::int64_t>(s.misses - 3, 5);
    }
    if (snapshots && m < k) replay.push_back({&s, s.computed, {d.begin(), d.begin() + m}});
    // Commit: the pending token's and the accepted drafts' KV is in place; the rest is overwritten later.
    hand_hidden(*out, s, r * T, s.computed, 1 + m);
    s.computed += 1 + m;
    auto& u = updates[s.id];
    u.id = s.id;
    for (const auto& p : picks) {
      ex->record_history(s.id, std::span(&p.token, 1));
      accept(s, exec::sampled_row{p, {}}, u);
      if (s.finished) break;
    }
    if (!s.finished) publish_full_blocks(s);
  }
  report.decode_rows += D;
  // A finished sequence's state goes with it; the others return to their state before the window and
  // take the committed tokens again.
  std::erase_if(replay, [](const replay_row& x) { return x.s->phase != seq_phase::running || x.s->state_row < 0; });
  if (!replay.empty())
    if (auto r = replay_accepted(replay, report); !r) {
      for (auto& [s, p, accepted] : replay) {
        finish(*s, finish_reason::error);
        updates[s->id].id = s->id;
        updates[s->id].finished = finish_reason::error;
      }
      return r;
    }
  return {};
}

result<void, driver_error> driver_state::copy_rows(std::span<const std::pair<std::int64_t, std::int64_t>> pairs, const std::vector<std::string>& names) {
  if (pairs.empty()) return {};
  auto failed = [](std::size_t rank, const exec::exec_error& e) {
    return unexpected(driver_error{driver_error_code::step_failed, "state rows on rank " + std::to_string(rank) + ": " + e.message()});
  };
  if (auto c = ex->copy_state_rows(exe, pairs, names); !c) return failed(0, c.error());
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i].ex)
      if (auto c = ranks[i].ex->copy_state_rows(ranks[i].exe, pairs, names); !c) return failed(i + 1, c.error());
  return {};
}

void driver_state::window_row(step_maps& m, std::int64_t r, const sequence& s, std::int64_t p, std::span<const std::int32_t> drafts) const {
  const std::int64_t C = m.read.shape()[1], T = m.ids.shape()[0] / m.read.shape()[0], k = static_cast<std::int64_t>(drafts.size());
  for (std::int64_t t = 0; t < T; ++t) {
    const bool real = t <= k;
    m.ids.as<std::int32_t>()[r * T + t] = !real ? 0 : t == 0 ? s.tokens[static_cast<std::size_t>(p)] : drafts[static_cast<std::size_t>(t - 1)];
    m.pos.as<std::int32_t>()[r * T + t] = static_cast<std::int32_t>(p + std::min(t, k));
    m.write.as<std::int32_t>()[r * T + t] = real ? slot_of(s, p + t) : -1;
  }
  for (std::int64_t j = 0; j <= p + k; ++j) m.read.as<std::int32_t>()[r * C + j] = slot_of(s, j);
  m.row_of(r, s);
}

result<exec::step_outputs, exec::exec_error> driver_state::step_everywhere(const entry_key& key, const exec::step_inputs& in) {
  std::optional<others_run> others;
  if (!ranks.empty()) others.emplace(rank_threads(), key, in);
  auto out = [&] {
    timed t{counters.executor_seconds};
    return ex->step(entries.at(key), in);
  }();
  if (others)
    if (auto e = others->wait(); e && out) out = unexpected(*e);
  return out;
}

result<void, driver_error> driver_state::replay_accepted(const std::vector<replay_row>& rows, step_report& report) {
  std::vector<std::pair<std::int64_t, std::int64_t>> back;
  std::size_t longest = 0;
  for (const auto& x : rows) {
    back.emplace_back(x.s->state_row + options.max_rows, x.s->state_row);
    longest = std::max(longest, x.accepted.size());
  }
  if (auto c = copy_row_states(back); !c) return c;
  const auto D = static_cast<std::int64_t>(rows.size());
  const auto R = *std::lower_bound(row_buckets.begin(), row_buckets.end(), D);
  const auto T = *std::lower_bound(verify_widths.begin(), verify_widths.end(), static_cast<std::int64_t>(longest) + 1);
  const auto key = verify_key(R, T);
  step_maps maps(R, T, options.capacity);
  for (std::int64_t r = 0; r < D; ++r) window_row(maps, r, *rows[static_cast<std::size_t>(r)].s, rows[static_cast<std::size_t>(r)].p, rows[static_cast<std::size_t>(r)].accepted);
  auto out = step_everywhere(key, bind(key, maps.values()));
  ++report.executor_steps;
  if (!out) return unexpected(driver_error{driver_error_code::step_failed, "replay of accepted drafts " + key.str() + ": " + out.error().message()});
  return {};
}

result<void, driver_error> driver_state::run_prefill(sequence& s, std::int64_t n, step_report& report, std::map<seq_id, seq_update>& updates) {
  const auto T = *std::lower_bound(chunk_buckets.begin(), chunk_buckets.end(), n);
  const auto C = options.capacity;
  const std::int64_t pending = static_cast<std::int64_t>(s.tokens.size()) - s.computed;
  const bool last = n == pending;
  const bool want_logits = last && s.req.head == head_kind::logits;
  const auto key = step_key(1, T, want_logits ? head_kind::logits : head_kind::sample, carried_for(s, s.computed, n));
  if (!key.carried.empty() && !entries.contains(key))
    if (auto a = add(key); !a) return a;  // a combination of carried inputs met for the first time
  const auto entry = entries.at(key);
  step_maps m(1, T, C);
  const std::int64_t pad = T - n;  // at the front, so the row's last token is real (padding writes nothing)
  for (std::int64_t t = pad; t < T; ++t) {
    const std::int64_t p = s.computed + t - pad;
    m.ids.as<std::int32_t>()[t] = s.tokens[static_cast<std::size_t>(p)];
    m.pos.as<std::int32_t>()[t] = static_cast<std::int32_t>(p);
    m.write.as<std::int32_t>()[t] = slot_of(s, p);
  }
  const std::int64_t end = s.computed + n;
  for (std::int64_t j = 0; j < end; ++j) m.read.as<std::int32_t>()[j] = slot_of(s, j);
  m.row_of(0, s);
  const auto in = bind(key, m.values());
  ++report.executor_steps;
  result<std::vector<exec::sampled_row>, exec::exec_error> picks = std::vector<exec::sampled_row>{};
  std::optional<others_run> others;
  if (!ranks.empty()) others.emplace(rank_threads(), key, in);
  exec::step_outputs rest;
  if (timed t{counters.executor_seconds}; last) {
    const exec::sample_row_request head{s.id, s.req.sampling, static_cast<std::uint64_t>(s.generated), want_logits};
    std::vector<sequence*> one{&s};
    picks = ex->step_sample(entry, in, std::span(&head, 1), mask_hook_for(one), carry_hidden ? &rest : nullptr);
  } else {
    auto out = ex->step(entry, in);
    if (!out) picks = unexpected(out.error());
    else rest = std::move(*out);
  }
  if (others)
    if (auto e = others->wait(); e && picks) picks = unexpected(*e);
  if (!picks) {
    finish(s, finish_reason::error);
    updates[s.id].id = s.id;
    updates[s.id].finished = finish_reason::error;
    return unexpected(driver_error{driver_error_code::step_failed, "prefill step " + key.str() + ": " + picks.error().message()});
  }
  hand_hidden(rest, s, pad, s.computed, n);
  s.computed = end;
  report.prefill_tokens += n;
  counters.prefill_tokens += n;
  publish_full_blocks(s);
  if (last) {
    if (s.group != 0) return beam_step(s.id, {std::move(picks->front().pick)}, updates);  // the search's first step
    auto& u = updates[s.id];
    u.id = s.id;
    accept(s, picks->front(), u);
  }
  return {};
}

result<step_report, driver_error> driver_state::round() {
  timed whole{counters.round_seconds};
  step_report report;
  std::map<seq_id, seq_update> updates;
  ++counters.rounds;

  // Cancellations take effect first.
  for (auto& [id, s] : seqs)
    if (s.cancel && s.phase != seq_phase::finished) finish(s, finish_reason::cancelled);

  // Admission, first come first served (preempted sequences were put back at the front).
  // A sequence is admitted only while the pool can hold all its tokens so far and the next one, so
  // a preempted sequence does not come straight back to take blocks from the rows that preempted it.
  while (!waiting.empty() && static_cast<std::int64_t>(running.size()) + reserved_rows() < options.max_rows) {
    auto& s = seqs.at(waiting.front());
    // A beam search takes its width in rows: the forks it makes after its prompt.
    // A recurrent model's search holds one row more, to stage the reorder of its beams' state rows.
    const std::int64_t width = s.req.beams > 1 ? s.req.beams + (recurrent ? 1 : 0) : 0;
    if (width > 0 && static_cast<std::int64_t>(running.size()) + reserved_rows() + width > options.max_rows) break;
    const auto need = (static_cast<std::int64_t>(s.tokens.size()) + block_size) / block_size;
    if (!running.empty() && pool->available() < need) break;
    // Its adapter resident first: with every slot held by running sequences it waits for one.
    auto ready = acquire_adapter(s);
    if (!ready) return unexpected(ready.error());
    if (!*ready) break;
    waiting.pop_front();
    if (auto a = admit(s); !a) return unexpected(a.error());
    if (auto g = groups.find(s.id); g != groups.end()) g->second.reserved = width - 1;
  }

  // Decode rows: running sequences with exactly their last pick pending.
  std::vector<sequence*> decode;
  for (auto id : std::vector<seq_id>(running)) {
    auto& s = seqs.at(id);
    if (s.phase != seq_phase::running) continue;
    if (static_cast<std::int64_t>(s.tokens.size()) - s.computed != 1) continue;
    if (s.limit >= 0 && static_cast<std::int64_t>(s.tokens.size()) >= s.limit) continue;  // a mirror holding its drafts
    if (!ensure_blocks(s, s.computed + 1, report)) {
      finish(s, finish_reason::pool_exhausted);
      continue;
    }
    decode.push_back(&s);
  }
  // A preemption may have taken rows already chosen.
  std::erase_if(decode, [](sequence* s) { return s->phase != seq_phase::running || s->blocks.empty(); });
  result<void, driver_error> failure{};
  bool chained = false;
  if (!decode.empty() && chainable(decode)) {
    auto c = run_chain(decode, report, updates);
    if (!c) failure = unexpected(c.error());
    else chained = *c;
  }
  if (!decode.empty() && !chained && failure) {
    // A draft policy that fails (its model's step) costs the round its drafts, never its tokens.
    // Rows with drafts verify them in one step; the others (no draft, guided, logits) decode as ever.
    auto drafted = draft_for(decode);
    if (!drafted || drafted->empty()) {
      failure = run_decode(decode, report, updates);
    } else {
      std::vector<sequence*> verify, plain;
      std::vector<std::vector<std::int32_t>> of;
      for (std::size_t i = 0; i < decode.size(); ++i) {
        if ((*drafted)[i].empty()) {
          plain.push_back(decode[i]);
        } else {
          verify.push_back(decode[i]);
          of.push_back(std::move((*drafted)[i]));
        }
      }
      failure = run_verify(verify, of, report, updates);
      if (failure && !plain.empty()) failure = run_decode(plain, report, updates);
    }
  }

  // Prefill chunks while the budget lasts.
  std::int64_t budget = options.token_budget - static_cast<std::int64_t>(decode.size());
  std::vector<sequence*> prefilled;  // prompts done this round
  if (failure) {
    for (auto id : std::vector<seq_id>(running)) {
      if (budget <= 0) break;
      auto it = seqs.find(id);
      if (it == seqs.end() || it->second.phase != seq_phase::running) continue;
      auto& s = it->second;
      const std::int64_t pending = static_cast<std::int64_t>(s.tokens.size()) - s.computed;
      if (pending <= 1) continue;  // a decode row (or done)
      const std::int64_t n = whole_spans(s, std::min({pending, options.prefill_chunk, budget}));
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
      if (s.phase == seq_phase::running && static_cast<std::int64_t>(s.tokens.size()) - s.computed == 1) prefilled.push_back(&s);
    }
  }
  // A draft model prefills each prompt in the round the target does, before the first token is
  // reported, rather than in the first decode round's drafts (where a long prompt's draft prefill
  // stalled the first verify: at 4096 tokens, decode with drafts ran at 0.13x decode without).
  if (drafts && failure && !prefilled.empty()) prime_drafts(prefilled);

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

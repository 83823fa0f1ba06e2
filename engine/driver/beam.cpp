// Beam search over the serving surface: a group's live beams decode as ordinary rows; after each
// step the group keeps its `beams` best continuations, forks share their parent's KV blocks (a
// partly filled block is copied, copy-on-write, through executor::copy_state_rows), and a beam
// that draws an end token becomes a hypothesis. A recurrent model's beams each own a state row: a
// continuation takes its parent's state, copied row to row in an order that never overwrites a row
// still to be read (a cycle goes through one spare row the search holds).
#include <algorithm>
#include <cmath>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {

namespace {

double score_of(double logprob, std::int64_t length, float penalty) {
  return logprob / std::pow(static_cast<double>(std::max<std::int64_t>(length, 1)), static_cast<double>(penalty));
}

// The copies that give row dst[i] the state of row src[i] (every dst distinct), in an order that
// reads each row before it is overwritten: a copy whose destination no pending copy reads goes first;
// when every pending destination is still to be read (a cycle), one source moves to `spare` first.
std::vector<std::pair<std::int64_t, std::int64_t>> reorder_copies(std::vector<std::int64_t> src, const std::vector<std::int64_t>& dst, std::int64_t spare) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::vector<bool> done(dst.size(), false);
  for (std::size_t i = 0; i < dst.size(); ++i) done[i] = src[i] == dst[i];
  auto read_later = [&](std::int64_t row) {
    for (std::size_t j = 0; j < dst.size(); ++j)
      if (!done[j] && src[j] == row) return true;
    return false;
  };
  for (;;) {
    bool progress = false, left = false;
    for (std::size_t i = 0; i < dst.size(); ++i) {
      if (done[i]) continue;
      left = true;
      if (read_later(dst[i])) continue;
      out.emplace_back(src[i], dst[i]);
      done[i] = true;
      progress = true;
    }
    if (!left) return out;
    if (progress) continue;
    // A cycle: the first pending copy's source goes to the spare row, and its readers read it there.
    std::size_t first = 0;
    while (done[first]) ++first;
    const auto from = src[first];
    out.emplace_back(from, spare);
    for (std::size_t j = 0; j < dst.size(); ++j)
      if (!done[j] && src[j] == from) src[j] = spare;
  }
}

void keep_best(std::vector<beam_result>& done, std::size_t width) {
  std::stable_sort(done.begin(), done.end(), [](const beam_result& a, const beam_result& b) { return a.score > b.score; });
  if (done.size() > width) done.resize(width);
}

}  // namespace

std::int64_t driver_state::reserved_rows() const {
  std::int64_t r = 0;
  for (const auto& [id, g] : groups) r += g.reserved;
  return r;
}

void driver_state::end_beams(sequence& head, std::map<seq_id, seq_update>& updates) {
  auto it = groups.find(head.id);
  if (it == groups.end()) return;
  auto g = std::move(it->second);
  groups.erase(it);
  keep_best(g.done, static_cast<std::size_t>(head.req.beams));
  if (const auto* codec = handle->text())
    for (auto& b : g.done) {
      text::detokenizer d(*codec, {});
      for (auto t : b.tokens) b.text += d.push(t).text;
      b.text += d.finish().text;
    }
  // The forks go; the request's own sequence finishes with the best hypothesis as its output.
  for (auto id : g.live)
    if (id != head.id)
      if (auto f = seqs.find(id); f != seqs.end()) {
        finish(f->second, finish_reason::cancelled);
        seqs.erase(f);
      }
  auto& u = updates[head.id];
  u.id = head.id;
  if (!g.done.empty()) {
    const auto& best = g.done.front();
    u.tokens = best.tokens;
    head.tokens.resize(static_cast<std::size_t>(head.prompt_len));
    head.tokens.insert(head.tokens.end(), best.tokens.begin(), best.tokens.end());
    head.generated = static_cast<std::int64_t>(best.tokens.size());
    if (head.detok) {
      for (auto t : best.tokens) u.text += head.detok->push(t).text;
      u.text += head.detok->finish().text;
    }
  }
  u.beams = g.done;
  finish(head, g.done.empty() ? finish_reason::length : g.done.front().finished);
}

result<void, driver_error> driver_state::beam_step(seq_id head_id, const std::vector<exec::sample_pick>& picks, std::map<seq_id, seq_update>& updates) {
  auto& head = seqs.at(head_id);
  auto& g = groups.at(head_id);
  const auto W = static_cast<std::size_t>(head.req.beams);
  const float lp = head.req.length_penalty;
  struct cand {
    double logprob;
    std::size_t parent;
    std::int32_t token;
  };
  std::vector<cand> cands;
  for (std::size_t j = 0; j < picks.size() && j < g.live.size(); ++j)
    for (const auto& e : picks[j].top)
      if (std::isfinite(e.logprob)) cands.push_back({g.logprob[j] + e.logprob, j, e.token});
  std::stable_sort(cands.begin(), cands.end(), [](const cand& a, const cand& b) {
    if (a.logprob != b.logprob) return a.logprob > b.logprob;
    if (a.parent != b.parent) return a.parent < b.parent;
    return a.token < b.token;
  });
  const auto& first = seqs.at(g.live.front());
  const std::int64_t length = first.generated + 1;  // every live beam has the same length
  auto ends = [&](std::int32_t t) {
    return (!head.req.ignore_eos && std::binary_search(eos.begin(), eos.end(), t)) ||
           std::find(head.stop_ids.begin(), head.stop_ids.end(), t) != head.stop_ids.end();
  };
  auto output_of = [&](std::size_t parent, std::int32_t t) {
    const auto& b = seqs.at(g.live[parent]);
    std::vector<std::int32_t> out(b.tokens.begin() + b.prompt_len, b.tokens.end());
    out.push_back(t);
    return out;
  };
  std::vector<cand> next;
  for (std::size_t rank = 0; rank < cands.size() && next.size() < W; ++rank) {
    const auto& c = cands[rank];
    if (ends(c.token)) {
      if (rank < W) g.done.push_back({output_of(c.parent, c.token), {}, c.logprob, score_of(c.logprob, length, lp), finish_reason::eos});
      continue;
    }
    next.push_back(c);
  }
  keep_best(g.done, W);
  const bool at_length = length >= head.req.max_tokens;
  if (at_length)  // the next beams are complete as they are
    for (const auto& c : next) g.done.push_back({output_of(c.parent, c.token), {}, c.logprob, score_of(c.logprob, length, lp), finish_reason::length});
  bool over = next.empty() || at_length;
  if (!over && g.done.size() >= W) {
    keep_best(g.done, W);
    over = head.req.early_stopping || score_of(next.front().logprob, length, lp) <= g.done.back().score;
  }
  if (over) {
    end_beams(head, updates);
    return {};
  }

  // The next beams: each takes its parent's tokens and blocks (shared), plus its token.
  struct state {
    std::vector<std::int32_t> tokens;
    std::vector<block_id> blocks;
    std::vector<std::uint64_t> chain;
    std::int64_t computed, generated;
  };
  std::vector<state> states;
  // A recurrent model: the state row of each live beam now, which its continuations start from.
  std::vector<std::int64_t> parent_rows;
  if (recurrent)
    for (auto id : g.live) parent_rows.push_back(seqs.at(id).state_row);
  for (const auto& c : next) {
    const auto& p = seqs.at(g.live[c.parent]);
    state s{p.tokens, p.blocks, p.chain, p.computed, p.generated + 1};
    s.tokens.push_back(c.token);
    for (auto b : s.blocks) pool->retain(b);
    states.push_back(std::move(s));
  }
  for (auto id : g.live) {
    auto& b = seqs.at(id);
    for (auto blk : b.blocks) pool->release(blk);
    b.blocks.clear();
  }
  // Members: the live ones, then forks for the rest (their rows were reserved at admission).
  while (g.live.size() < next.size()) {
    sequence f;
    f.id = next_id++;
    f.req = head.req;
    f.prompt_len = head.prompt_len;
    f.cacheable = head.cacheable;
    f.stop_ids = head.stop_ids;
    f.group = head.id;
    f.phase = seq_phase::running;
    f.admitted = next_admission++;
    f.cached = 0;
    if (auto h = ex->open_history(f.id, vocab, std::span(head.tokens.data(), static_cast<std::size_t>(head.prompt_len)), head.req.logit_bias); !h)
      return unexpected(driver_error{driver_error_code::step_failed, "beam fork: " + h.error().message()});
    if (recurrent) {  // its rows were reserved with the search: one is free
      if (free_state_rows.empty()) return unexpected(driver_error{driver_error_code::step_failed, "beam fork: no recurrent state row is free"});
      f.state_row = free_state_rows.back();
      free_state_rows.pop_back();
    }
    running.push_back(f.id);
    g.live.push_back(f.id);
    if (g.reserved > (recurrent ? 1 : 0)) --g.reserved;  // a recurrent search keeps its staging row
    seqs.emplace(f.id, std::move(f));
  }
  if (recurrent) {  // each continuation's state row takes its parent's state, before any beam leaves
    std::vector<std::int64_t> src, dst;
    for (std::size_t i = 0; i < next.size(); ++i) {
      src.push_back(parent_rows[next[i].parent]);
      dst.push_back(seqs.at(g.live[i]).state_row);
    }
    if (free_state_rows.empty()) return unexpected(driver_error{driver_error_code::step_failed, "beam reorder: no recurrent state row is free"});
    const auto order = reorder_copies(src, dst, free_state_rows.back());
    if (auto c = copy_row_states(order); !c) {
      end_beams(head, updates);
      return unexpected(driver_error{driver_error_code::step_failed, "beam reorder: " + c.error().message()});
    }
  }
  while (g.live.size() > next.size()) {  // fewer continuations than beams (a tiny vocabulary)
    auto f = seqs.find(g.live.back());
    if (f != seqs.end() && f->first != head.id) {
      finish(f->second, finish_reason::cancelled);
      seqs.erase(f);
      ++g.reserved;  // its row stays the search's, for a later fork
    }
    g.live.pop_back();
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> copies;
  bool dry = false;
  for (std::size_t i = 0; i < next.size(); ++i) {
    auto& b = seqs.at(g.live[i]);
    auto& s = states[i];
    // Copy-on-write: the block the pending token writes into, when partly filled and shared.
    const std::int64_t p = s.computed, k = p / block_size;
    if (p % block_size != 0 && k < static_cast<std::int64_t>(s.blocks.size()) && pool->refs(s.blocks[static_cast<std::size_t>(k)]) > 1) {
      const auto fresh = pool->allocate();
      if (!fresh) {
        dry = true;
      } else {
        const auto old = s.blocks[static_cast<std::size_t>(k)];
        for (std::int64_t q = 0; q < p % block_size; ++q) copies.emplace_back(std::int64_t{old} * block_size + q, std::int64_t{*fresh} * block_size + q);
        pool->release(old);
        s.blocks[static_cast<std::size_t>(k)] = *fresh;
      }
    }
    b.tokens = std::move(s.tokens);
    b.blocks = std::move(s.blocks);
    b.chain = std::move(s.chain);
    b.computed = s.computed;
    b.generated = s.generated;
    g.logprob.resize(next.size());
    g.logprob[i] = next[i].logprob;
  }
  // The KV pools' slots only (a recurrent model's per-row states are not indexed by slot), on every rank.
  if (!copies.empty() && (!recurrent || !kv_states.empty()))
    if (auto c = copy_rows(copies, kv_states); !c) {
      end_beams(head, updates);
      return unexpected(driver_error{driver_error_code::step_failed, "beam fork: " + c.error().message()});
    }
  if (dry) {
    updates[head.id].id = head.id;
    end_beams(head, updates);
    head.finished = finish_reason::pool_exhausted;
  }
  return {};
}

}  // namespace troupe::driver

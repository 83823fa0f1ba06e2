// The model's multi-token-prediction layer as a draft policy (speculation.hpp: make_mtp_drafter).
//
// The draft program (families/components/mtp.hpp) runs in the target's own executable: its weights
// are the target's, its KV state (the MTP layer's kv.*.L) lives at the target's slots, through the
// target sequence's block table. So it needs no blocks, no mirror sequence and no rollback of its own:
// a rejected draft's MTP KV sits past the sequence's committed length and is overwritten, like the
// target's.
//
// Draft position p pairs the target's hidden state at p with the token at p + 1. Each target step
// hands over the hidden states of the positions it committed (observe); when the sequence next asks
// for drafts, one step of the draft program catches the MTP layer up over those positions (their
// next tokens are known by then, the last being the pending pick), and its last row's logits give
// the first draft. Further drafts chain: the draft token at the next position, with the MTP layer's
// own output hidden state in place of the target's (vLLM's MTP proposer for K > 1). Drafts are the
// argmax chain; the target's verify keeps the output exact whatever they are.
#include <algorithm>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {
namespace {

class mtp_drafter final : public drafter {
 public:
  mtp_drafter(driver_state& d, std::int64_t hidden) : d_(d), H_(hidden) {}

  bool wants_hidden() const override { return true; }
  std::int64_t steps() const override { return steps_; }
  void forget(seq_id id) override { pending_.erase(id); }

  void observe(seq_id id, std::int64_t first, const float* rows, std::int64_t count) override {
    const auto s = d_.seqs.find(id);
    if (s == d_.seqs.end() || !drafts_for(s->second)) return;
    auto& p = pending_[id];
    const auto have = static_cast<std::int64_t>(p.rows.size()) / H_;
    if (p.rows.empty() || first < p.base || first > p.base + have) {
      p.base = first;  // a gap (a recomputed or resumed sequence): start over from here
      p.rows.clear();
    } else {
      p.rows.resize(static_cast<std::size_t>((first - p.base) * H_));  // positions recomputed replace their rows
    }
    p.rows.insert(p.rows.end(), rows, rows + count * H_);
    p.drafted_at = -1;
    p.drafts.clear();
  }

  result<std::vector<std::vector<std::int32_t>>, driver_error> propose(std::span<const draft_row> asks) override {
    const auto K = d_.options.speculation.tokens;
    std::vector<std::vector<std::int32_t>> out(asks.size());
    // Each row's catch-up: positions [base, P) of its pending hidden states, P its pending token's position.
    std::vector<row_in> batch, singles;
    std::vector<std::size_t> batch_of, single_of;
    for (std::size_t i = 0; i < asks.size(); ++i) {
      const auto it = d_.seqs.find(asks[i].id);
      if (it == d_.seqs.end() || asks[i].want < 1) continue;
      auto& s = it->second;
      const auto pit = pending_.find(s.id);
      const std::int64_t P = s.computed;
      if (pit == pending_.end() || static_cast<std::int64_t>(s.tokens.size()) != P + 1) continue;
      auto& pend = pit->second;
      const std::int64_t n = static_cast<std::int64_t>(pend.rows.size()) / H_;
      if (n == 0 && pend.drafted_at == P && !pend.drafts.empty()) {
        // Asked again before the target moved (the row decoded without its drafts): the same drafts.
        out[i].assign(pend.drafts.begin(), pend.drafts.begin() + std::min<std::int64_t>(asks[i].want, static_cast<std::int64_t>(pend.drafts.size())));
        continue;
      }
      if (n < 1 || pend.base + n != P) {  // no hidden state for position P - 1: nothing to draft from
        pending_.erase(pit);
        continue;
      }
      row_in r{&s, pend.base, n, s.tokens.data() + pend.base + 1, pend.rows.data()};
      if (n <= K + 1) {
        batch.push_back(r);
        batch_of.push_back(i);
      } else {
        singles.push_back(r);
        single_of.push_back(i);
      }
    }
    // First drafts and the last MTP hidden state of each row.
    std::vector<std::vector<float>> last(asks.size());
    if (!batch.empty()) {
      std::int64_t longest = 0;
      for (const auto& r : batch) longest = std::max(longest, r.n);
      auto got = step(batch, longest == 1 ? 1 : K + 1);
      if (!got) return unexpected(got.error());
      for (std::size_t j = 0; j < batch.size(); ++j) {
        out[batch_of[j]].push_back((*got)[j].first);
        last[batch_of[j]] = std::move((*got)[j].second);
      }
    }
    for (std::size_t j = 0; j < singles.size(); ++j) {
      // A prefill's catch-up, a chunk at a time.
      const auto& r = singles[j];
      std::pair<std::int32_t, std::vector<float>> tail;
      for (std::int64_t at = 0; at < r.n; at += d_.options.prefill_chunk) {
        const std::int64_t n = std::min(d_.options.prefill_chunk, r.n - at);
        std::vector<row_in> one{{r.s, r.first + at, n, r.tokens + at, r.hidden + at * H_}};
        const std::int64_t T = n == 1 ? 1 : n <= K + 1 ? K + 1 : *std::lower_bound(d_.chunk_buckets.begin(), d_.chunk_buckets.end(), n);
        auto got = step(one, T);
        if (!got) return unexpected(got.error());
        tail = std::move(got->front());
      }
      out[single_of[j]].push_back(tail.first);
      last[single_of[j]] = std::move(tail.second);
    }
    // Everything observed is in the MTP layer's KV now.
    for (const auto& group : {&batch, &singles})
      for (const auto& r : *group) {
        auto& p = pending_[r.s->id];
        p.base = r.s->computed;
        p.rows.clear();
      }
    // Further drafts: the previous draft at the next position, over the MTP layer's own hidden state.
    for (std::int64_t k = 2; k <= K; ++k) {
      std::vector<row_in> chain;
      std::vector<std::size_t> of;
      for (std::size_t i = 0; i < asks.size(); ++i) {
        if (static_cast<std::int64_t>(out[i].size()) != k - 1 || asks[i].want < k) continue;
        auto& s = d_.seqs.at(asks[i].id);
        const std::int64_t q = s.computed + k - 2;  // where the previous draft sits
        if (q >= static_cast<std::int64_t>(s.blocks.size()) * d_.block_size) continue;  // no block there yet
        chain.push_back({&s, q, 1, &out[i].back(), last[i].data()});
        of.push_back(i);
      }
      if (chain.empty()) break;
      auto got = step(chain, 1);
      if (!got) return unexpected(got.error());
      for (std::size_t j = 0; j < chain.size(); ++j) {
        out[of[j]].push_back((*got)[j].first);
        last[of[j]] = std::move((*got)[j].second);
      }
    }
    for (const auto& group : {&batch, &singles})
      for (const auto& r : *group) {
        auto& p = pending_[r.s->id];
        p.drafted_at = r.s->computed;
        for (std::size_t i = 0; i < asks.size(); ++i)
          if (asks[i].id == r.s->id) p.drafts = out[i];
      }
    return out;
  }

 private:
  struct pending {
    std::int64_t base = 0;     // the position of the first row
    std::vector<float> rows;   // [positions, H]: the target's hidden states not yet in the MTP layer
    std::int64_t drafted_at = -1;       // the pending position the last drafts were made for
    std::vector<std::int32_t> drafts;   // those drafts
  };
  // Positions [first, first + n) of a sequence: the tokens that followed them and their hidden states.
  struct row_in {
    sequence* s;
    std::int64_t first, n;
    const std::int32_t* tokens;
    const float* hidden;
  };

  static bool drafts_for(const sequence& s) {
    return s.req.speculate && !s.req.guide && s.req.head == head_kind::sample && s.group == 0;
  }

  // One step of the draft program over `rows` (each padded at the front to T tokens): each row's
  // argmax after its last position and the MTP layer's hidden state there.
  result<std::vector<std::pair<std::int32_t, std::vector<float>>>, driver_error> step(const std::vector<row_in>& rows, std::int64_t T) {
    const auto D = static_cast<std::int64_t>(rows.size());
    const auto R = *std::lower_bound(d_.row_buckets.begin(), d_.row_buckets.end(), D);
    const auto C = d_.options.capacity;
    const auto key = d_.draft_key(R, T);
    const auto entry = d_.entries.find(key);
    if (entry == d_.entries.end()) return unexpected(driver_error{driver_error_code::step_failed, "MTP draft: no entry " + key.str()});
    step_maps m(R, T, C);
    tensor hidden(dtype::f32, {R * T, H_});
    std::fill_n(hidden.as<float>(), R * T * H_, 0.0f);
    for (std::int64_t r = 0; r < D; ++r) {
      const auto& x = rows[static_cast<std::size_t>(r)];
      const std::int64_t pad = T - x.n;
      for (std::int64_t t = pad; t < T; ++t) {
        const std::int64_t p = x.first + t - pad;
        m.ids.as<std::int32_t>()[r * T + t] = x.tokens[t - pad];
        m.pos.as<std::int32_t>()[r * T + t] = static_cast<std::int32_t>(p);
        m.write.as<std::int32_t>()[r * T + t] = d_.slot_of(*x.s, p);
        std::copy_n(x.hidden + (t - pad) * H_, H_, hidden.as<float>() + (r * T + t) * H_);
      }
      for (std::int64_t j = 0; j < x.first + x.n; ++j) m.read.as<std::int32_t>()[r * C + j] = d_.slot_of(*x.s, j);
    }
    auto v = m.values();
    v.hidden_states = hidden.view();
    auto res = d_.ex->step(entry->second, d_.bind(key, v));
    ++steps_;
    if (!res) return unexpected(driver_error{driver_error_code::step_failed, "MTP draft " + key.str() + ": " + res.error().message()});
    const auto lo = res->outputs.find("logits"), hi = res->outputs.find("hidden");
    if (lo == res->outputs.end() || hi == res->outputs.end() || lo->second.shape().rank() != 2 || lo->second.shape()[0] < D)
      return unexpected(driver_error{driver_error_code::step_failed, "MTP draft " + key.str() + ": no logits and hidden states"});
    const auto V = lo->second.shape()[1];
    std::vector<std::pair<std::int32_t, std::vector<float>>> got;
    for (std::int64_t r = 0; r < D; ++r) {
      const float* row = lo->second.as<float>() + r * V;
      const float* h = hi->second.as<float>() + (r * T + T - 1) * H_;
      got.emplace_back(static_cast<std::int32_t>(std::max_element(row, row + V) - row), std::vector<float>(h, h + H_));
    }
    return got;
  }

  driver_state& d_;
  std::int64_t H_;
  std::map<seq_id, pending> pending_;
  std::int64_t steps_ = 0;
};

}  // namespace

result<std::unique_ptr<drafter>, driver_error> make_mtp_drafter(driver_state& d) {
  if (!d.handle->model().schema().offers(families::program::draft))
    return unexpected(driver_error{driver_error_code::program_not_offered, "MTP speculation: the model has no multi-token-prediction layer"});
  if (!d.ranks.empty())
    return unexpected(driver_error{driver_error_code::bad_options, "MTP drafts run on a single rank"});
  return std::unique_ptr<drafter>(std::make_unique<mtp_drafter>(d, d.handle->model().config().hidden));
}

}  // namespace troupe::driver

// Draft policies: prompt lookup (n-gram) and a draft model (speculation.hpp).
#include "engine/driver/speculation.hpp"

#include <algorithm>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {

std::string_view name(draft_kind k) {
  switch (k) {
    case draft_kind::none: return "none";
    case draft_kind::ngram: return "ngram";
    case draft_kind::model: return "model";
    case draft_kind::mtp: return "mtp";
  }
  return "unknown";
}

// ---- prompt lookup ----------------------------------------------------------------------------------

std::vector<std::int32_t> ngram_draft(std::span<const std::int32_t> tokens, std::int64_t n_min, std::int64_t n_max, std::int64_t want) {
  const auto L = static_cast<std::int64_t>(tokens.size());
  if (want < 1 || n_min < 1) return {};
  for (std::int64_t n = std::min(n_max, L - 1); n >= n_min; --n) {
    const auto suffix = tokens.subspan(static_cast<std::size_t>(L - n));
    for (std::int64_t start = L - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const std::int64_t follow = start + n, take = std::min(want, L - follow);
      if (take > 0) return {tokens.begin() + follow, tokens.begin() + follow + take};
    }
  }
  return {};
}

namespace {

class ngram_drafter final : public drafter {
 public:
  explicit ngram_drafter(const speculation_options& o) : o_(o) {}
  result<std::vector<std::vector<std::int32_t>>, driver_error> propose(std::span<const draft_row> rows) override {
    std::vector<std::vector<std::int32_t>> out;
    out.reserve(rows.size());
    for (const auto& r : rows) out.push_back(ngram_draft(r.tokens, o_.ngram_min, o_.ngram_max, r.want));
    return out;
  }

 private:
  speculation_options o_;
};

// ---- a draft model ----------------------------------------------------------------------------------

// Mirror sequences get ids far above the target's, so that on a shared executor their sampling
// histories never meet the target's.
constexpr seq_id mirror_ids = seq_id{1} << 62;

class model_drafter final : public drafter {
 public:
  explicit model_drafter(std::unique_ptr<driver_state> d) : d_(std::move(d)) { d_->next_id = mirror_ids; }

  result<std::vector<std::vector<std::int32_t>>, driver_error> propose(std::span<const draft_row> rows) override {
    auto& d = *d_;
    std::vector<sequence*> mirrors(rows.size(), nullptr);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const auto n = static_cast<std::int64_t>(r.tokens.size());
      if (r.want < 1 || n + r.want > d.options.capacity) continue;
      sequence* m = mirror(r.id);
      if (m && m->phase == seq_phase::finished) {
        forget(r.id);
        m = nullptr;
      }
      if (!m) {
        if (!(m = open(r.id, r.tokens))) continue;
      } else {
        // Keep the common prefix (its KV stays), then the target's tokens past it, pending.
        const auto common = static_cast<std::int64_t>(
            std::mismatch(m->tokens.begin(), m->tokens.end(), r.tokens.begin(), r.tokens.end()).first - m->tokens.begin());
        d.truncate(*m, common);
        m->tokens.insert(m->tokens.end(), r.tokens.begin() + common, r.tokens.end());
      }
      m->limit = n + r.want;
      mirrors[i] = m;
    }
    // Rounds of the draft driver until every mirror holds its drafts (or cannot go on).
    auto pending = [&] {
      for (auto* m : mirrors)
        if (m && m->phase != seq_phase::finished && static_cast<std::int64_t>(m->tokens.size()) < m->limit) return true;
      return false;
    };
    for (int guard = 0; pending() && guard < 4096; ++guard) {
      auto r = d.round();
      if (!r) return unexpected(driver_error{driver_error_code::step_failed, "draft model: " + r.error().message()});
      steps_ += r->executor_steps;
      if (r->executor_steps == 0) break;  // nothing could run (no row or block for a mirror)
    }
    std::vector<std::vector<std::int32_t>> out(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto* m = mirrors[i];
      if (!m) continue;
      const auto n = rows[i].tokens.size();
      if (m->tokens.size() > n) out[i].assign(m->tokens.begin() + static_cast<std::ptrdiff_t>(n), m->tokens.end());
      if (static_cast<std::int64_t>(out[i].size()) > rows[i].want) out[i].resize(static_cast<std::size_t>(rows[i].want));
    }
    return out;
  }

  // The prompt's KV and the draft of the first token: the next propose keeps them as the common
  // prefix with the target's tokens (all of them when the draft guessed the first token).
  void prime(std::span<const draft_row> rows) override { (void)propose(rows); }

  void forget(seq_id id) override {
    const auto it = of_.find(id);
    if (it == of_.end()) return;
    auto s = d_->seqs.find(it->second);
    if (s != d_->seqs.end()) {
      d_->finish(s->second, finish_reason::cancelled);
      d_->seqs.erase(s);
    }
    of_.erase(it);
  }
  std::int64_t steps() const override { return steps_; }

 private:
  sequence* mirror(seq_id target) {
    const auto it = of_.find(target);
    if (it == of_.end()) return nullptr;
    const auto s = d_->seqs.find(it->second);
    return s == d_->seqs.end() ? nullptr : &s->second;
  }
  sequence* open(seq_id target, std::span<const std::int32_t> tokens) {
    auto& d = *d_;
    sequence s;
    s.id = d.next_id++;
    s.tokens.assign(tokens.begin(), tokens.end());
    s.prompt_len = static_cast<std::int64_t>(tokens.size());
    s.req.ignore_eos = true;  // greedy, no penalties: the drafts are the draft model's argmax chain
    s.req.max_tokens = d.options.capacity;
    s.req.speculate = false;
    s.cacheable = false;
    const auto id = s.id;
    d.seqs.emplace(id, std::move(s));
    d.waiting.push_back(id);
    of_[target] = id;
    return &d.seqs.at(id);
  }

  std::unique_ptr<driver_state> d_;
  std::map<seq_id, seq_id> of_;  // target sequence -> its mirror
  std::int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<drafter> make_ngram_drafter(const speculation_options& o) { return std::make_unique<ngram_drafter>(o); }

result<std::unique_ptr<drafter>, driver_error> make_model_drafter(const driver_options& target, std::int64_t target_vocab) {
  const auto& sp = target.speculation;
  auto fail = [](std::string why) { return unexpected(driver_error{driver_error_code::prepare_failed, "draft model: " + std::move(why)}); };
  if (!sp.draft_model || !sp.draft_executor) return fail("no draft checkpoint or executor");
  const auto dv = sp.draft_model->model().config().vocab;
  if (dv != target_vocab)
    return fail("its vocabulary (" + std::to_string(dv) + ") is not the target's (" + std::to_string(target_vocab) + ")");
  auto d = std::make_unique<driver_state>();
  d->handle = sp.draft_model;
  d->ex = sp.draft_executor;
  driver_options o;
  o.max_rows = target.max_rows;
  o.capacity = target.capacity;
  o.paged = target.paged;
  o.block_size = target.block_size;
  o.prefill_chunk = target.prefill_chunk;
  o.smallest_chunk = 2;  // a mirror catches up by a token or two after each verify
  o.token_budget = target.token_budget;
  o.prefix_cache = false;  // mirrors are rolled back: their blocks are theirs alone
  o.preempt = true;
  o.max_entries = target.max_entries;
  o.limits = target.limits;
  d->options = o;
  if (auto p = d->prepare(); !p) return fail(p.error().message());
  // A mirror is cut back to the target's tokens by truncating its KV; a recurrent state has no earlier
  // position to cut back to.
  if (d->recurrent) return fail("a recurrent draft model cannot roll its state back to the target's tokens (the target may be recurrent; its draft may not)");
  return std::unique_ptr<drafter>(std::make_unique<model_drafter>(std::move(d)));
}

}  // namespace troupe::driver

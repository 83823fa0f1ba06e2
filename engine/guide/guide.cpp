#include "engine/guide/guide.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/guide/json_schema.hpp"
#include "engine/guide/regex_gbnf.hpp"
#include "engine/text/tokenizer.hpp"

namespace troupe::guide {

std::string_view name(guide_kind kind) {
  switch (kind) {
    case guide_kind::none: return "none";
    case guide_kind::json_object: return "json_object";
    case guide_kind::json_schema: return "json_schema";
    case guide_kind::regex: return "regex";
    case guide_kind::grammar: return "grammar";
    case guide_kind::choice: return "choice";
  }
  return "unknown";
}

result<std::string, guide_error> to_gbnf(const guide_spec& spec) {
  switch (spec.kind) {
    case guide_kind::none:
      return unexpected(guide_error{guide_error_code::bad_grammar, "guide", "no guide given"});
    case guide_kind::json_object: return json_object_gbnf();
    case guide_kind::json_schema: return json_schema_to_gbnf(spec.text);
    case guide_kind::regex: return regex_to_gbnf(spec.text, "root");
    case guide_kind::grammar: return spec.text;
    case guide_kind::choice: {
      auto j = nlohmann::json::parse(spec.text, nullptr, false);
      if (j.is_discarded() || !j.is_array() || j.empty())
        return unexpected(guide_error{guide_error_code::bad_schema, "choice", "choices are a non-empty array of strings"});
      std::string g = "root ::= ";
      for (std::size_t k = 0; k < j.size(); ++k) {
        if (!j[k].is_string())
          return unexpected(guide_error{guide_error_code::bad_schema, "choice[" + std::to_string(k) + "]", "a choice is a string"});
        if (k) g += " | ";
        g += gbnf_literal(j[k].get<std::string>());
      }
      return g + "\n";
    }
  }
  return unexpected(guide_error{guide_error_code::unsupported, "guide", "unknown guide kind"});
}

result<std::shared_ptr<const grammar>, guide_error> compile(const guide_spec& spec) {
  auto text = to_gbnf(spec);
  if (!text) return unexpected(text.error());
  auto g = parse_gbnf(*text, "root");
  if (!g) {
    auto e = g.error();
    // A generated grammar that fails to parse is troupe's bug, not the request's; say which source.
    if (spec.kind != guide_kind::grammar) e.where = std::string(name(spec.kind)) + " -> grammar " + e.where;
    return unexpected(std::move(e));
  }
  return std::make_shared<const grammar>(std::move(*g));
}

// ---- vocabulary ---------------------------------------------------------------------------------------

vocabulary::vocabulary(std::size_t size, std::vector<std::optional<std::string>> pieces,
                       std::vector<std::pair<std::int32_t, std::string>> first, std::vector<std::int32_t> eos)
    : size_(size), pieces_(std::move(pieces)), first_(std::move(first)), eos_(std::move(eos)) {
  pieces_.resize(std::min(pieces_.size(), size_));
  std::sort(eos_.begin(), eos_.end());
  eos_.erase(std::unique(eos_.begin(), eos_.end()), eos_.end());
  std::erase_if(eos_, [&](std::int32_t id) { return id < 0 || static_cast<std::size_t>(id) >= size_; });
  for (std::size_t k = 0; k < first_.size(); ++k) first_index_[first_[k].first] = k;

  // The trie: pieces sorted, then one node per distinct prefix, built over sorted ranges.
  std::vector<std::int32_t> order;
  for (std::size_t id = 0; id < pieces_.size(); ++id)
    if (pieces_[id] && !pieces_[id]->empty() && !is_eos(static_cast<std::int32_t>(id))) order.push_back(static_cast<std::int32_t>(id));
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return *pieces_[a] < *pieces_[b]; });
  for (auto id : order) longest_ = std::max(longest_, pieces_[id]->size());
  for (const auto& [id, bytes] : first_) longest_ = std::max(longest_, bytes.size());
  tokens_.reserve(order.size());
  nodes_.push_back({});
  // Work list of (node, range of order, depth); children of a node are contiguous in edges_.
  struct job {
    std::uint32_t node;
    std::size_t lo, hi, depth;
  };
  std::vector<job> work{{0, 0, order.size(), 0}};
  while (!work.empty()) {
    const auto j = work.back();
    work.pop_back();
    std::size_t k = j.lo;
    nodes_[j.node].tokens_begin = static_cast<std::uint32_t>(tokens_.size());
    while (k < j.hi && pieces_[order[k]]->size() == j.depth) tokens_.push_back(order[k++]);
    nodes_[j.node].tokens_end = static_cast<std::uint32_t>(tokens_.size());
    nodes_[j.node].edges_begin = static_cast<std::uint32_t>(edges_.size());
    std::vector<job> children;
    while (k < j.hi) {
      const auto b = static_cast<std::uint8_t>((*pieces_[order[k]])[j.depth]);
      std::size_t e = k;
      while (e < j.hi && static_cast<std::uint8_t>((*pieces_[order[e]])[j.depth]) == b) ++e;
      const auto child = static_cast<std::uint32_t>(nodes_.size());
      nodes_.push_back({});
      edges_.push_back({b, child});
      children.push_back({child, k, e, j.depth + 1});
      k = e;
    }
    nodes_[j.node].edges_end = static_cast<std::uint32_t>(edges_.size());
    work.insert(work.end(), children.rbegin(), children.rend());
  }
}

vocabulary vocabulary::of(const text::tokenizer& tok, std::size_t size, std::vector<std::int32_t> eos) {
  const auto n = std::min(size, tok.vocab_size());
  std::vector<std::optional<std::string>> pieces(n);
  std::vector<std::pair<std::int32_t, std::string>> first;
  const auto start = tok.parts().dec.stream_start();
  for (std::size_t id = 0; id < n; ++id) {
    const auto t = static_cast<text::token_id>(id);
    if (tok.is_special(t)) continue;
    auto p = tok.stream_piece(t, 1, true);
    if (!p || p->empty()) continue;
    auto f = tok.stream_piece(t, 0, true);
    if (f) {
      // The detokenizer's start rule strips up to `count` leading `content` from the whole text.
      for (std::size_t c = 0; c < start.count && !start.content.empty() && f->starts_with(start.content); ++c)
        f->erase(0, start.content.size());
      if (*f != *p) first.emplace_back(static_cast<std::int32_t>(id), f->empty() ? std::string() : *f);
    }
    pieces[id] = std::move(p);
  }
  return vocabulary(size, std::move(pieces), std::move(first), std::move(eos));
}

const std::optional<std::string>& vocabulary::piece(std::int32_t id) const {
  static const std::optional<std::string> none;
  if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size()) return none;
  return pieces_[static_cast<std::size_t>(id)];
}

const std::string* vocabulary::first_piece(std::int32_t id) const {
  auto it = first_index_.find(id);
  return it == first_index_.end() ? nullptr : &first_[it->second].second;
}

bool vocabulary::is_eos(std::int32_t id) const { return std::binary_search(eos_.begin(), eos_.end(), id); }

// ---- guide --------------------------------------------------------------------------------------------

guide::guide(std::shared_ptr<const grammar> g, std::shared_ptr<const vocabulary> vocab) : a_(std::move(g)), vocab_(std::move(vocab)) {}

void guide::advance(cursor& c, std::span<const std::int32_t> output) {
  if (c.generation != a_.generation() || output.size() < c.consumed ||
      !std::equal(c.seen.begin(), c.seen.end(), output.begin())) {
    c = cursor{a_.generation(), a_.start(), 0, {}};
  }
  for (; c.consumed < output.size(); ++c.consumed) {
    const auto id = output[c.consumed];
    c.seen.push_back(id);
    if (vocab_->is_eos(id)) continue;
    const std::string* bytes = nullptr;
    if (c.consumed == 0) bytes = vocab_->first_piece(id);
    if (!bytes) {
      const auto& p = vocab_->piece(id);
      bytes = p ? &*p : nullptr;
    }
    if (!bytes) {
      c.state = automaton::dead;
      continue;
    }
    c.state = a_.next(c.state, *bytes);
  }
}

guide::cached_mask guide::compute_mask(automaton::state s, bool first, std::uint32_t limit) {
  const auto& v = *vocab_;
  cached_mask out;
  auto& mask = out.words;
  mask.assign(v.words(), 0u);
  auto allow = [&](std::int32_t id) { mask[static_cast<std::size_t>(id) >> 5] |= 1u << (id & 31); };
  auto disallow = [&](std::int32_t id) { mask[static_cast<std::size_t>(id) >> 5] &= ~(1u << (id & 31)); };
  // Whether a token leading to `to` may be drawn, and the largest such cost seen.
  auto fits = [&](automaton::state to) {
    const auto c = a_.cost(to);
    if (c > limit) return false;
    out.max_next_cost = std::max(out.max_next_cost, c);
    return true;
  };
  if (s != automaton::dead) {
    const auto& nodes = v.nodes();
    const auto& edges = v.edges();
    const auto& tokens = v.tokens();
    std::vector<std::pair<std::uint32_t, automaton::state>> stack{{0u, s}};
    while (!stack.empty()) {
      const auto [n, st] = stack.back();
      stack.pop_back();
      for (auto e = nodes[n].edges_begin; e < nodes[n].edges_end; ++e) {
        const auto to = a_.next(st, edges[e].byte);
        if (to == automaton::dead) continue;
        const auto& child = nodes[edges[e].child];
        if (child.tokens_begin != child.tokens_end && fits(to))
          for (auto t = child.tokens_begin; t < child.tokens_end; ++t) allow(tokens[t]);
        if (child.edges_begin != child.edges_end) stack.emplace_back(edges[e].child, to);
      }
    }
    if (first) {
      // Tokens that spell other bytes at the start of the output are judged by those bytes.
      for (const auto& [id, bytes] : v.first_pieces()) {
        disallow(id);
        if (bytes.empty()) continue;
        const auto to = a_.next(s, bytes);
        if (to != automaton::dead && fits(to)) allow(id);
      }
    }
    if (a_.accepting(s))
      for (auto id : v.eos()) allow(id);
  }
  // Nothing may follow (an output the guide cannot continue): end it rather than draw from nothing.
  if (std::all_of(mask.begin(), mask.end(), [](std::uint32_t w) { return w == 0; }))
    for (auto id : v.eos()) allow(id);
  return out;
}

void guide::fill_mask(cursor& c, std::span<const std::int32_t> output, std::span<std::uint32_t> mask, std::int64_t budget) {
  std::lock_guard lock(mu_);
  ++counters_.masks;
  if (a_.maybe_reset()) {
    masks_.clear();
    first_mask_.reset();
  }
  advance(c, output);
  const bool first = c.consumed == 0;
  const cached_mask* m = nullptr;
  if (first && first_mask_) {
    m = &*first_mask_;
    ++counters_.mask_hits;
  } else if (!first) {
    if (auto it = masks_.find(c.state); it != masks_.end()) {
      m = &it->second;
      ++counters_.mask_hits;
    }
  }
  if (!m) {
    auto fresh = compute_mask(c.state, first, automaton::unreachable);
    if (first) {
      first_mask_ = std::move(fresh);
      m = &*first_mask_;
    } else {
      // Bound the cache (max_mask_bytes).
      if ((masks_.size() + 1) * vocab_->words() * 4 > max_mask_bytes) masks_.clear();
      m = &(masks_[c.state] = std::move(fresh));
    }
  }
  // Short of budget: after this token `budget - 1` remain, and a token may leave at most that many
  // bytes to complete. The full mask stands when every allowed token fits, or when no token can bring
  // the cost within the budget (a token shortens it by at most its length: no completion fits
  // whatever is drawn); otherwise the walk is redone with the limit.
  std::optional<cached_mask> tight;
  if (c.state != automaton::dead && budget - 1 < static_cast<std::int64_t>(m->max_next_cost) &&
      static_cast<std::int64_t>(a_.cost(c.state)) - static_cast<std::int64_t>(vocab_->longest_piece()) <= budget - 1) {
    const auto limit = static_cast<std::uint32_t>(std::max<std::int64_t>(budget - 1, 0));
    tight = compute_mask(c.state, first, limit);
    // When nothing but the end fits and the output is not complete, no completion fits the budget:
    // the full mask stands rather than an early end.
    bool other = false;
    for (std::size_t w = 0; w < tight->words.size() && !other; ++w) {
      auto bits = tight->words[w];
      for (auto id : vocab_->eos())
        if (static_cast<std::size_t>(id) >> 5 == w) bits &= ~(1u << (id & 31));
      other = bits != 0;
    }
    if (other || a_.accepting(c.state)) m = &*tight;
  }
  const auto n = std::min(mask.size(), m->words.size());
  std::copy(m->words.begin(), m->words.begin() + static_cast<std::ptrdiff_t>(n), mask.begin());
  counters_.states = static_cast<std::int64_t>(a_.states());
}

bool guide::accepts(std::span<const std::int32_t> output) {
  std::lock_guard lock(mu_);
  cursor c;
  advance(c, output);
  return c.state != automaton::dead && a_.accepting(c.state);
}

std::size_t guide::approx_bytes() const {
  std::lock_guard lock(mu_);
  return a_.approx_bytes() + (masks_.size() + (first_mask_ ? 1 : 0)) * vocab_->words() * 4;
}

guide::counters guide::stats() const {
  std::lock_guard lock(mu_);
  return counters_;
}

std::function<void(std::span<const std::int32_t>, std::span<std::uint32_t>)> hook(std::shared_ptr<guide> g, std::int64_t max_tokens) {
  auto c = std::make_shared<guide::cursor>();
  return [g = std::move(g), c, max_tokens](std::span<const std::int32_t> output, std::span<std::uint32_t> mask) {
    g->fill_mask(*c, output, mask, max_tokens - static_cast<std::int64_t>(output.size()));
  };
}

// ---- cache --------------------------------------------------------------------------------------------

guide_cache::guide_cache(std::shared_ptr<const vocabulary> vocab, std::size_t capacity, std::size_t max_bytes)
    : vocab_(std::move(vocab)), capacity_(std::max<std::size_t>(capacity, 1)), max_bytes_(max_bytes) {}

std::size_t guide_cache::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

result<std::shared_ptr<guide>, guide_error> guide_cache::get(const guide_spec& spec) {
  {
    std::lock_guard lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (it->first == spec) {
        lru_.splice(lru_.begin(), lru_, it);
        return lru_.front().second;
      }
  }
  auto g = compile(spec);  // outside the lock: a large schema should not stall other requests
  if (!g) return unexpected(g.error());
  auto made = std::make_shared<guide>(std::move(*g), vocab_);
  std::lock_guard lock(mu_);
  lru_.emplace_front(spec, made);
  // Drop the least recently used guides that no sequence holds (use_count 1: only this list) while
  // past either bound; the newest is kept whatever its size.
  std::size_t bytes = 0;
  for (const auto& e : lru_) bytes += e.second->approx_bytes();
  auto it = lru_.end();
  while (it != std::next(lru_.begin()) && (lru_.size() > capacity_ || bytes > max_bytes_)) {
    --it;  // from the back toward the front, never the front itself
    if (it->second.use_count() == 1) {
      bytes -= std::min(bytes, it->second->approx_bytes());
      it = lru_.erase(it);
    }
  }
  return made;
}

}  // namespace troupe::guide

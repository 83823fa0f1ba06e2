#include "engine/text/added_vocabulary.hpp"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <utility>

#include "engine/text/detail/unicode.hpp"

namespace troupe::text {

namespace {

// A byte trie over token patterns; matching walks it from each position for the longest pattern.
class pattern_trie {
 public:
  pattern_trie() { nodes_.emplace_back(); root_.fill(-1); }

  void insert(std::string_view pattern, int token) {
    if (pattern.empty()) return;
    int at = 0;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
      const auto b = static_cast<unsigned char>(pattern[i]);
      int next = i == 0 ? root_[b] : child(at, b);
      if (next < 0) {
        next = static_cast<int>(nodes_.size());
        nodes_.emplace_back();
        if (i == 0) {
          root_[b] = next;
        } else {
          nodes_[static_cast<std::size_t>(at)].children.emplace_back(b, next);
        }
      }
      at = next;
    }
    // The first token with a given pattern keeps it.
    if (nodes_[static_cast<std::size_t>(at)].token < 0) nodes_[static_cast<std::size_t>(at)].token = token;
  }

  bool empty() const { return nodes_.size() == 1; }
  bool may_start(unsigned char b) const { return root_[b] >= 0; }

  // The longest pattern starting at text[pos]: (token, length), or token -1.
  std::pair<int, std::size_t> longest(std::string_view text, std::size_t pos) const {
    int at = root_[static_cast<unsigned char>(text[pos])];
    std::pair<int, std::size_t> best{-1, 0};
    std::size_t i = pos + 1;
    while (at >= 0) {
      const auto& n = nodes_[static_cast<std::size_t>(at)];
      if (n.token >= 0) best = {n.token, i - pos};
      if (i >= text.size()) break;
      at = child(at, static_cast<unsigned char>(text[i]));
      ++i;
    }
    return best;
  }

 private:
  struct node {
    std::vector<std::pair<unsigned char, int>> children;
    int token = -1;
  };
  int child(int at, unsigned char b) const {
    for (const auto& [c, n] : nodes_[static_cast<std::size_t>(at)].children)
      if (c == b) return n;
    return -1;
  }
  std::vector<node> nodes_;
  std::array<int, 256> root_{};
};

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  std::size_t end = s.size();
  return detail::is_word_char(detail::prev_scalar(s, end));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  std::size_t i = 0;
  return detail::is_word_char(detail::next_scalar(s, i));
}

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

struct added_vocabulary::state {
  std::vector<added_token> tokens;
  std::unordered_map<token_id, std::size_t> by_id;
  std::unordered_map<std::string, std::size_t, string_hash, std::equal_to<>> by_content;
  pattern_trie raw;
  pattern_trie normalized;
};

added_vocabulary::added_vocabulary() : state_(std::make_shared<state>()) {}

void added_vocabulary::set_tokens(std::vector<added_token> tokens, const std::vector<std::string>& patterns) {
  auto s = std::make_shared<state>();
  s->tokens = std::move(tokens);
  for (std::size_t i = 0; i < s->tokens.size(); ++i) {
    const auto& t = s->tokens[i];
    s->by_id.insert_or_assign(t.id, i);
    s->by_content.try_emplace(t.content, i);
    (t.normalized ? s->normalized : s->raw).insert(patterns[i], static_cast<int>(i));
  }
  state_ = std::move(s);
}

const std::vector<added_token>& added_vocabulary::tokens() const { return state_->tokens; }

const added_token* added_vocabulary::find(token_id id) const {
  const auto it = state_->by_id.find(id);
  return it == state_->by_id.end() ? nullptr : &state_->tokens[it->second];
}

std::optional<token_id> added_vocabulary::find(std::string_view content) const {
  const auto it = state_->by_content.find(content);
  if (it == state_->by_content.end()) return std::nullopt;
  return state_->tokens[it->second].id;
}

bool added_vocabulary::is_special(token_id id) const {
  const auto* t = find(id);
  return t != nullptr && t->special;
}

void added_vocabulary::split_raw(std::string_view text, std::vector<added_split>& out) const {
  split(false, text, out);
}

void added_vocabulary::split_normalized(std::string_view text, std::vector<added_split>& out) const {
  split(true, text, out);
}

void added_vocabulary::split(bool normalized, std::string_view text, std::vector<added_split>& out) const {
  const pattern_trie& trie = normalized ? state_->normalized : state_->raw;
  out.clear();
  if (trie.empty() || text.empty()) {
    out.push_back({0, text.size(), std::nullopt});
    return;
  }
  // Hugging Face's find_matches over an Aho-Corasick leftmost-longest iterator: a match that is then
  // discarded (single_word, split special tokens) still moves the search past it.
  std::size_t start_offset = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.may_start(static_cast<unsigned char>(text[pos]))) {
      ++pos;
      continue;
    }
    const auto [index, length] = trie.longest(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const added_token& tok = state_->tokens[static_cast<std::size_t>(index)];
    std::size_t start = pos;
    std::size_t stop = pos + length;
    pos = stop;
    if (split_special_ && tok.special) continue;
    if (tok.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      const std::size_t trimmed = start - detail::trailing_white_space(text.substr(0, start));
      start = std::max(trimmed, start_offset);
    }
    if (tok.rstrip) stop += detail::leading_white_space(text.substr(stop));
    if (start > start_offset) out.push_back({start_offset, start, std::nullopt});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), std::nullopt});
}

}  // namespace troupe::text

#include "engine/text/pre_tokenizer.hpp"

#include <algorithm>

#include "engine/text/detail/byte_level.hpp"
#include "engine/text/detail/unicode.hpp"

namespace troupe::text {

namespace {

// A word being cut: [start, start + length) of the current buffer.
struct piece {
  std::size_t start = 0;
  std::size_t length = 0;
  bool at_origin = false;
};

// A stretch of a piece, relative to its start, and whether the pattern matched it.
struct segment {
  std::size_t start = 0;
  std::size_t end = 0;
  bool matched = false;
};

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};

// The segments covering a text of `size` bytes, from the pattern's matches (Hugging Face's
// Pattern::find_matches).
void segments_from_matches(std::size_t size, const std::vector<match_span>& matches, std::vector<segment>& out) {
  out.clear();
  if (size == 0) {
    out.push_back({0, 0, false});
    return;
  }
  std::size_t prev = 0;
  for (const auto& m : matches) {
    if (prev != m.start) out.push_back({prev, m.start, false});
    out.push_back({m.start, m.end, true});
    prev = m.end;
  }
  if (prev != size) out.push_back({prev, size, false});
}

// Segments where each character for which `pred` holds is a match of its own.
template <class Pred>
void segments_from_chars(std::string_view text, Pred pred, std::vector<segment>& out) {
  out.clear();
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  std::size_t last = 0, i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    const char32_t c = detail::next_scalar(text, i);
    if (pred(c)) {
      if (last < start) out.push_back({last, start, false});
      out.push_back({start, i, true});
      last = i;
    }
  }
  if (text.size() > last) out.push_back({last, text.size(), false});
}

// Applies a delimiter behaviour to the segments of `p` (Hugging Face's NormalizedString::split) and
// appends the non-empty pieces.
void emit(const piece& p, std::vector<segment>& segs, split_behavior behavior, bool invert, std::vector<segment>& scratch,
          std::vector<piece>& out) {
  if (invert)
    for (auto& s : segs) s.matched = !s.matched;
  const std::vector<segment>* pieces = &scratch;
  scratch.clear();
  switch (behavior) {
    case split_behavior::isolated:
      pieces = &segs;
      break;
    case split_behavior::removed:
      for (const auto& s : segs)
        if (!s.matched) scratch.push_back(s);
      break;
    case split_behavior::merged_with_previous: {
      bool previous_match = false;
      for (const auto& s : segs) {
        if (s.matched && !previous_match && !scratch.empty()) {
          scratch.back().end = s.end;
        } else {
          scratch.push_back(s);
        }
        previous_match = s.matched;
      }
      break;
    }
    case split_behavior::merged_with_next: {
      bool previous_match = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->matched && !previous_match && !scratch.empty()) {
          scratch.back().start = it->start;
        } else {
          scratch.push_back(*it);
        }
        previous_match = it->matched;
      }
      std::reverse(scratch.begin(), scratch.end());
      break;
    }
    case split_behavior::contiguous: {
      bool previous_match = false;
      for (const auto& s : segs) {
        if (s.matched == previous_match && !scratch.empty()) {
          scratch.back().end = s.end;
        } else {
          scratch.push_back(s);
        }
        previous_match = s.matched;
      }
      break;
    }
  }
  for (const auto& s : *pieces)
    if (s.end > s.start) out.push_back({p.start + s.start, s.end - s.start, p.at_origin && s.start == 0});
}

const text_pattern& gpt2_regex() {
  static const text_pattern p = *text_pattern::regex(gpt2_word_pattern);
  return p;
}

const text_pattern& whitespace_regex() {
  static const text_pattern p = *text_pattern::regex("\\w+|[^\\w\\s]+");
  return p;
}

// Per-thread scratch space, so splitting a word allocates nothing once warm.
struct scratch_space {
  std::string other;  // the buffer a transforming step writes into
  std::string prefixed;
  std::vector<piece> current, next, words;
  std::vector<match_span> matches;
  std::vector<segment> segs, segs2;
};

}  // namespace

bool pre_tokenizer::ends_with_byte_level() const {
  return !steps_.empty() && std::holds_alternative<byte_level_pre_tokenizer>(steps_.back());
}

void pre_tokenizer::apply(std::string_view text, bool at_origin, word_list& out, bool raw_bytes) const {
  thread_local scratch_space sc;
  std::string& buf = out.buffer_;
  buf.assign(text);
  std::vector<piece>& current = sc.current;
  current.assign(1, piece{0, text.size(), at_origin});
  for (std::size_t k = 0; k < steps_.size(); ++k) {
    const auto& step = steps_[k];
    const bool last = k + 1 == steps_.size();
    sc.next.clear();
    bool transformed = false;  // the step wrote its pieces into sc.other
    std::visit(
        overloaded{
            [&](const split_pre_tokenizer& s) {
              for (const auto& p : current) {
                const std::string_view w = std::string_view(buf).substr(p.start, p.length);
                sc.matches.clear();
                s.pattern.find_all(w, sc.matches);
                segments_from_matches(w.size(), sc.matches, sc.segs);
                emit(p, sc.segs, s.behavior, s.invert, sc.segs2, sc.next);
              }
            },
            [&](const byte_level_pre_tokenizer& s) {
              const bool map = !(raw_bytes && last);
              // Unmapped and unprefixed, the words stay spans of buf; otherwise they are written out.
              const bool copy = map || s.add_prefix_space;
              if (copy) {
                sc.other.clear();
                transformed = true;
              }
              for (const auto& p : current) {
                std::string_view w = std::string_view(buf).substr(p.start, p.length);
                if (s.add_prefix_space && (w.empty() || w.front() != ' ')) {
                  sc.prefixed.assign(" ");
                  sc.prefixed.append(w);
                  w = sc.prefixed;
                }
                sc.words.clear();
                const piece whole{0, w.size(), p.at_origin};
                if (s.use_regex) {
                  sc.matches.clear();
                  gpt2_regex().find_all(w, sc.matches);
                  segments_from_matches(w.size(), sc.matches, sc.segs);
                  emit(whole, sc.segs, split_behavior::isolated, false, sc.segs2, sc.words);
                } else if (!w.empty()) {
                  sc.words.push_back(whole);
                }
                for (const auto& word : sc.words) {
                  if (!copy) {
                    sc.next.push_back({p.start + word.start, word.length, word.at_origin});
                    continue;
                  }
                  const std::size_t start = sc.other.size();
                  const std::string_view sub = w.substr(word.start, word.length);
                  if (map) {
                    detail::byte_level_encode(sub, sc.other);
                  } else {
                    sc.other.append(sub);
                  }
                  sc.next.push_back({start, sc.other.size() - start, word.at_origin});
                }
              }
            },
            [&](const metaspace_pre_tokenizer& s) {
              sc.other.clear();
              transformed = true;
              for (const auto& p : current) {
                const std::string_view w = std::string_view(buf).substr(p.start, p.length);
                const std::size_t start = sc.other.size();
                // Spaces become the replacement first, so a leading space counts as a leading replacement.
                const bool starts = (!w.empty() && w.front() == ' ') || w.starts_with(s.replacement);
                if (!starts && (s.scheme == prepend_scheme::always || (s.scheme == prepend_scheme::first && p.at_origin)))
                  sc.other += s.replacement;
                for (const char c : w) {
                  if (c == ' ') {
                    sc.other += s.replacement;
                  } else {
                    sc.other += c;
                  }
                }
                const std::size_t length = sc.other.size() - start;
                if (!s.split) {
                  if (length > 0) sc.next.push_back({start, length, p.at_origin});
                  continue;
                }
                const std::string_view mw = std::string_view(sc.other).substr(start, length);
                sc.matches.clear();
                text_pattern::literal(s.replacement).find_all(mw, sc.matches);
                segments_from_matches(mw.size(), sc.matches, sc.segs);
                emit({start, length, p.at_origin}, sc.segs, split_behavior::merged_with_next, false, sc.segs2,
                     sc.next);
              }
            },
            [&](const digits_pre_tokenizer& s) {
              for (const auto& p : current) {
                segments_from_chars(std::string_view(buf).substr(p.start, p.length), detail::is_numeric, sc.segs);
                emit(p, sc.segs, s.individual ? split_behavior::isolated : split_behavior::contiguous, false, sc.segs2,
                     sc.next);
              }
            },
            [&](const punctuation_pre_tokenizer& s) {
              for (const auto& p : current) {
                segments_from_chars(std::string_view(buf).substr(p.start, p.length), detail::is_punctuation, sc.segs);
                emit(p, sc.segs, s.behavior, false, sc.segs2, sc.next);
              }
            },
            [&](const whitespace_pre_tokenizer&) {
              for (const auto& p : current) {
                const std::string_view w = std::string_view(buf).substr(p.start, p.length);
                sc.matches.clear();
                whitespace_regex().find_all(w, sc.matches);
                segments_from_matches(w.size(), sc.matches, sc.segs);
                emit(p, sc.segs, split_behavior::removed, true, sc.segs2, sc.next);
              }
            },
            [&](const whitespace_split_pre_tokenizer&) {
              for (const auto& p : current) {
                segments_from_chars(std::string_view(buf).substr(p.start, p.length), detail::is_white_space, sc.segs);
                emit(p, sc.segs, split_behavior::removed, false, sc.segs2, sc.next);
              }
            },
        },
        step);
    if (transformed) buf.swap(sc.other);
    current.swap(sc.next);
  }
  out.spans_.clear();
  for (const auto& p : current)
    if (p.length > 0) out.spans_.emplace_back(p.start, p.length);
}

}  // namespace troupe::text

#include "engine/text/tokenizer.hpp"

#include <algorithm>

#include "engine/text/detail/unicode.hpp"

namespace troupe::text {

tokenizer::tokenizer(tokenizer_parts parts)
    : parts_(std::make_shared<const tokenizer_parts>(std::move(parts))),
      raw_bytes_(parts_->pre.ends_with_byte_level() && parts_->model.reads_raw_bytes()) {}

result<std::vector<token_id>, text_error> tokenizer::encode(std::string_view text, bool add_special) const {
  if (!detail::valid_utf8(text)) {
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t n = 0;
      if (detail::classify_front(text.substr(at), n) != detail::utf8_front::complete) break;
      at += n;
    }
    return troupe::unexpected(
        text_error{text_error_code::invalid_utf8, "", "text", "is not valid UTF-8 at byte " + std::to_string(at)});
  }
  const tokenizer_parts& p = *parts_;
  std::vector<token_id> ids;
  ids.reserve(text.size() / 3 + 4);
  thread_local std::vector<added_split> raw, norm;
  thread_local word_list words;
  p.added.split_raw(text, raw);
  for (const auto& r : raw) {
    if (r.id) {
      ids.push_back(*r.id);
      continue;
    }
    if (r.end <= r.start) continue;
    const std::string_view piece = text.substr(r.start, r.end - r.start);
    std::string storage;
    std::string_view normalized = piece;
    if (!p.norm.empty()) {
      storage = p.norm.apply(piece);
      normalized = storage;
    }
    if (normalized.empty()) continue;
    p.added.split_normalized(normalized, norm);
    for (const auto& s : norm) {
      if (s.id) {
        ids.push_back(*s.id);
        continue;
      }
      if (s.end <= s.start) continue;
      const std::string_view sub = normalized.substr(s.start, s.end - s.start);
      if (p.pre.empty()) {
        p.model.tokenize(sub, ids);
        continue;
      }
      p.pre.apply(sub, r.start == 0 && s.start == 0, words, raw_bytes_);
      for (std::size_t w = 0; w < words.size(); ++w) {
        if (raw_bytes_) {
          p.model.tokenize_bytes(words[w], ids);
        } else {
          p.model.tokenize(words[w], ids);
        }
      }
    }
  }
  if (add_special) ids = p.post.apply(std::move(ids));
  return ids;
}

std::string tokenizer::decode(std::span<const token_id> ids, bool skip_special) const {
  const tokenizer_parts& p = *parts_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const token_id id : ids) {
    if (const auto* a = p.added.find(id)) {
      if (skip_special && a->special) continue;
      tokens.push_back(a->content);
      continue;
    }
    const auto t = p.model.id_to_token(id);
    if (!t) continue;
    // Hugging Face skips by content: a model token spelled like a special token goes too.
    if (skip_special) {
      if (const auto special = p.added.find(*t); special && p.added.is_special(*special)) continue;
    }
    tokens.emplace_back(*t);
  }
  if (p.dec.empty()) {
    std::string out;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  return p.dec.decode(std::move(tokens));
}

std::optional<std::string_view> tokenizer::id_to_token(token_id id) const {
  if (const auto* a = parts_->added.find(id)) return std::string_view(a->content);
  return parts_->model.id_to_token(id);
}

std::optional<token_id> tokenizer::token_to_id(std::string_view token) const {
  if (const auto id = parts_->added.find(token)) return id;
  return parts_->model.token_to_id(token);
}

std::size_t tokenizer::vocab_size() const {
  std::size_t n = parts_->model.id_limit();
  for (const auto& t : parts_->added.tokens()) n = std::max(n, static_cast<std::size_t>(t.id) + 1);
  return n;
}

bool tokenizer::is_special(token_id id) const { return parts_->added.is_special(id); }

std::optional<std::string> tokenizer::stream_piece(token_id id, std::size_t index, bool skip_special) const {
  const tokenizer_parts& p = *parts_;
  std::string_view token;
  if (const auto* a = p.added.find(id)) {
    if (skip_special && a->special) return std::nullopt;
    token = a->content;
  } else if (const auto t = p.model.id_to_token(id)) {
    if (skip_special) {
      if (const auto special = p.added.find(*t); special && p.added.is_special(*special)) return std::nullopt;
    }
    token = *t;
  } else {
    return std::nullopt;
  }
  if (p.dec.empty()) return index == 0 ? std::string(token) : " " + std::string(token);
  return p.dec.stream_piece(token, index);
}

const tokenizer_parts& tokenizer::parts() const { return *parts_; }

}  // namespace troupe::text

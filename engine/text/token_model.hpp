#pragma once
// The model stage of a tokenizer: what turns one pre-tokenized word into ids. BPE (every tokenizer of
// the generative models troupe serves) or WordPiece (BERT). A thin value over the two model classes that
// answers the questions the pipeline asks, so the pipeline does not care which it holds.
#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "engine/text/bpe_model.hpp"
#include "engine/text/token_id.hpp"
#include "engine/text/wordpiece_model.hpp"

namespace troupe::text {

class token_model {
 public:
  // Implicit: either model is a token_model.
  token_model(bpe_model m) : m_(std::move(m)) {}
  token_model(wordpiece_model m) : m_(std::move(m)) {}

  // Appends the ids of `word`.
  void tokenize(std::string_view word, std::vector<token_id>& out) const {
    std::visit([&](const auto& m) { m.tokenize(word, out); }, m_);
  }
  // Whether tokenize_bytes may be used (bpe_model::reads_raw_bytes); never for WordPiece.
  bool reads_raw_bytes() const {
    const auto* b = bpe();
    return b != nullptr && b->reads_raw_bytes();
  }
  // Only when reads_raw_bytes().
  void tokenize_bytes(std::string_view bytes, std::vector<token_id>& out) const {
    if (const auto* b = bpe()) b->tokenize_bytes(bytes, out);
  }

  std::optional<token_id> token_to_id(std::string_view token) const {
    return std::visit([&](const auto& m) { return m.token_to_id(token); }, m_);
  }
  std::optional<std::string_view> id_to_token(token_id id) const {
    return std::visit([&](const auto& m) { return m.id_to_token(id); }, m_);
  }
  // One past the largest id.
  std::size_t id_limit() const {
    return std::visit([](const auto& m) { return m.id_limit(); }, m_);
  }
  // The token that stands for what the vocabulary cannot spell, if the model has one.
  std::optional<std::string_view> unk_token() const {
    if (const auto* w = std::get_if<wordpiece_model>(&m_)) return std::string_view(w->options().unk_token);
    if (const auto& unk = std::get<bpe_model>(m_).options().unk_token) return std::string_view(*unk);
    return std::nullopt;
  }

  // The model itself, when it is of that kind.
  const bpe_model* bpe() const { return std::get_if<bpe_model>(&m_); }
  const wordpiece_model* wordpiece() const { return std::get_if<wordpiece_model>(&m_); }

 private:
  std::variant<bpe_model, wordpiece_model> m_;
};

}  // namespace troupe::text

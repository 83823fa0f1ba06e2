#include "engine/text/wordpiece_model.hpp"

#include <algorithm>
#include <functional>
#include <unordered_map>

#include "engine/text/detail/unicode.hpp"

namespace troupe::text {

namespace {

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

struct wordpiece_model::impl {
  wordpiece_options options;
  std::unordered_map<std::string, token_id, string_hash, std::equal_to<>> vocab;
  std::unordered_map<token_id, std::string_view> tokens;  // views of vocab's keys, which never move
  token_id unk = 0;
  std::size_t longest = 0;  // bytes of the longest entry: no longer lookup can match
  std::size_t limit = 0;
};

result<wordpiece_model, text_error> wordpiece_model::from_vocab(std::vector<std::pair<std::string, token_id>> vocab,
                                                                wordpiece_options options,
                                                                const wordpiece_source& source) {
  auto m = std::make_shared<impl>();
  m->options = std::move(options);
  m->vocab.reserve(vocab.size());
  for (auto& [tok, id] : vocab) {
    if (id < 0)
      return troupe::unexpected(text_error{text_error_code::bad_value, source.file, source.vocab_field,
                                           "token '" + tok + "' has the negative id " + std::to_string(id)});
    m->vocab.try_emplace(std::move(tok), id);
  }
  m->tokens.reserve(m->vocab.size());
  for (const auto& [tok, id] : m->vocab) {
    m->tokens.try_emplace(id, tok);
    m->longest = std::max(m->longest, tok.size());
    m->limit = std::max(m->limit, static_cast<std::size_t>(id) + 1);
  }
  const auto unk = m->vocab.find(m->options.unk_token);
  if (unk == m->vocab.end())
    return troupe::unexpected(text_error{text_error_code::unknown_token, source.file, source.vocab_field,
                                         "the unknown token '" + m->options.unk_token + "' is not in the vocabulary"});
  m->unk = unk->second;
  return wordpiece_model(std::move(m));
}

void wordpiece_model::tokenize(std::string_view word, std::vector<token_id>& out) const {
  if (word.empty()) return;
  const impl& m = *impl_;
  std::size_t chars = 0;
  for (std::size_t i = 0; i < word.size() && chars <= m.options.max_input_chars_per_word; ++chars)
    i += detail::utf8_length(static_cast<unsigned char>(word[i]));
  if (chars > m.options.max_input_chars_per_word) {
    out.push_back(m.unk);
    return;
  }
  const std::string& prefix = m.options.continuing_subword_prefix;
  thread_local std::string key;
  const std::size_t mark = out.size();
  std::size_t start = 0;
  while (start < word.size()) {
    // Longest match first; lookups longer than the longest entry are skipped, which changes nothing.
    const std::size_t room = m.longest - std::min(m.longest, start > 0 ? prefix.size() : 0);
    std::size_t end = std::min(word.size(), start + room);
    while (end > start && end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
    std::optional<token_id> found;
    while (end > start) {
      const std::string_view piece = word.substr(start, end - start);
      auto it = m.vocab.end();
      if (start == 0) {
        it = m.vocab.find(piece);
      } else {
        key.assign(prefix);
        key.append(piece);
        it = m.vocab.find(key);
      }
      if (it != m.vocab.end()) {
        found = it->second;
        break;
      }
      std::size_t back = end;
      detail::prev_scalar(word, back);
      end = back;
    }
    if (!found) {
      out.resize(mark);
      out.push_back(m.unk);
      return;
    }
    out.push_back(*found);
    start = end;
  }
}

std::optional<token_id> wordpiece_model::token_to_id(std::string_view token) const {
  const auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> wordpiece_model::id_to_token(token_id id) const {
  const auto it = impl_->tokens.find(id);
  if (it == impl_->tokens.end()) return std::nullopt;
  return it->second;
}

std::size_t wordpiece_model::id_limit() const { return impl_->limit; }

const wordpiece_options& wordpiece_model::options() const { return impl_->options; }

}  // namespace troupe::text

#include "engine/text/decoder.hpp"

#include <utility>

#include "engine/text/detail/byte_level.hpp"
#include "engine/text/detail/unicode.hpp"

namespace troupe::text {

namespace {

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string metaspace(std::string_view token, const metaspace_decoder& d, bool first) {
  std::string out;
  out.reserve(token.size());
  std::size_t i = 0;
  const bool drop = first && d.scheme != prepend_scheme::never;
  while (i < token.size()) {
    if (!d.replacement.empty() && token.compare(i, d.replacement.size(), d.replacement) == 0) {
      if (!drop) out += ' ';
      i += d.replacement.size();
      continue;
    }
    out += token[i++];
  }
  return out;
}

std::string strip(std::string_view token, const strip_decoder& d) {
  std::size_t begin = 0, end = token.size();
  if (d.content.empty()) return std::string(token);
  for (std::size_t k = 0; k < d.start && token.compare(begin, d.content.size(), d.content) == 0 && begin < end; ++k)
    begin += d.content.size();
  for (std::size_t k = 0; k < d.stop && end >= begin + d.content.size() &&
                          token.compare(end - d.content.size(), d.content.size(), d.content) == 0;
       ++k)
    end -= d.content.size();
  return std::string(token.substr(begin, end - begin));
}

// Rust's str::replace: every non-overlapping match, left to right.
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::size_t at = s.find(from);
  if (at == std::string::npos) return;
  std::string out;
  std::size_t done = 0;
  for (; at != std::string::npos; at = s.find(from, done)) {
    out.append(s, done, at - done);
    out += to;
    done = at + from.size();
  }
  out.append(s, done);
  s = std::move(out);
}

// Hugging Face's WordPiece decoder on the `index`-th token, cleanup rules in its order.
std::string wordpiece(std::string token, const wordpiece_decoder& d, std::size_t index) {
  if (index != 0) {
    if (token.starts_with(d.prefix)) {
      token.erase(0, d.prefix.size());
    } else {
      token.insert(0, 1, ' ');
    }
  }
  if (d.cleanup) {
    static constexpr std::pair<std::string_view, std::string_view> rules[] = {
        {" .", "."},   {" ?", "?"},   {" !", "!"},   {" ,", ","},   {" ' ", "'"},   {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"},        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : rules) replace_all(token, from, to);
  }
  return token;
}

void byte_level_join(const std::vector<std::string>& tokens, std::string& bytes) {
  for (const auto& t : tokens)
    if (!detail::byte_level_decode(t, bytes)) bytes += t;  // a token outside the alphabet stands for itself
}

}  // namespace

std::optional<unsigned char> byte_token_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return std::nullopt;
  const int hi = hex_digit(token[3]), lo = hex_digit(token[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

std::string decoder::decode(std::vector<std::string> tokens) const {
  for (const auto& step : steps_) {
    std::visit(overloaded{
                   [&](const byte_level_decoder&) {
                     std::string bytes;
                     byte_level_join(tokens, bytes);
                     tokens.assign(1, detail::lossy_utf8(bytes));
                   },
                   [&](const metaspace_decoder& d) {
                     for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = metaspace(tokens[i], d, i == 0);
                   },
                   [&](const byte_fallback_decoder&) {
                     std::vector<std::string> out;
                     out.reserve(tokens.size());
                     std::string bytes;
                     std::size_t count = 0;
                     const auto flush = [&] {
                       if (count == 0) return;
                       if (detail::valid_utf8(bytes)) {
                         out.push_back(bytes);
                       } else {
                         // Hugging Face replaces every byte of an invalid run, not each ill-formed part.
                         for (std::size_t k = 0; k < count; ++k) out.emplace_back("\xEF\xBF\xBD");
                       }
                       bytes.clear();
                       count = 0;
                     };
                     for (auto& t : tokens) {
                       if (const auto b = byte_token_value(t)) {
                         bytes += static_cast<char>(*b);
                         ++count;
                         continue;
                       }
                       flush();
                       out.push_back(std::move(t));
                     }
                     flush();
                     tokens = std::move(out);
                   },
                   [&](const fuse_decoder&) {
                     std::string joined;
                     for (const auto& t : tokens) joined += t;
                     tokens.assign(1, std::move(joined));
                   },
                   [&](const strip_decoder& d) {
                     for (auto& t : tokens) t = strip(t, d);
                   },
                   [&](const replace_decoder& d) {
                     for (auto& t : tokens) t = d.pattern.replace_all(t, d.content);
                   },
                   [&](const wordpiece_decoder& d) {
                     for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = wordpiece(std::move(tokens[i]), d, i);
                   },
               },
               step);
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::string decoder::stream_piece(std::string_view token, std::size_t index) const {
  std::string t(token);
  bool joined = false;  // once tokens are joined, rules about "the first token" mean the whole text
  for (const auto& step : steps_) {
    std::visit(overloaded{
                   [&](const byte_level_decoder&) {
                     std::string bytes;
                     if (!detail::byte_level_decode(t, bytes)) bytes = t;
                     t = std::move(bytes);
                     joined = true;
                   },
                   [&](const metaspace_decoder& d) { t = metaspace(t, d, joined ? false : index == 0); },
                   [&](const byte_fallback_decoder&) {
                     if (const auto b = byte_token_value(t)) t.assign(1, static_cast<char>(*b));
                   },
                   [&](const fuse_decoder&) { joined = true; },
                   [&](const strip_decoder& d) {
                     if (!joined) t = strip(t, d);
                   },
                   [&](const replace_decoder& d) { t = d.pattern.replace_all(t, d.content); },
                   [&](const wordpiece_decoder& d) { t = wordpiece(std::move(t), d, joined ? 0 : index); },
               },
               step);
  }
  return t;
}

stream_start_rule decoder::stream_start() const {
  stream_start_rule rule;
  bool joined = false;
  for (const auto& step : steps_) {
    if (std::holds_alternative<byte_level_decoder>(step) || std::holds_alternative<fuse_decoder>(step)) joined = true;
    if (const auto* s = std::get_if<strip_decoder>(&step); s != nullptr && joined && s->start > 0) {
      rule.content = s->content;
      rule.count += s->start;
    }
  }
  return rule;
}

}  // namespace troupe::text

#pragma once
// The Jinja lexer: template source to tokens, with the whitespace rules Hugging Face renders chat
// templates with (trim_blocks and lstrip_blocks on, `-` markers, the trailing newline dropped, the
// transformers-only {% generation %} tags removed). It follows @huggingface/jinja's lexer rule for
// rule, since where whitespace goes is most of what byte-exact output means.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/template_error.hpp"

namespace troupe::text::jinja {

enum class token_kind : std::uint8_t {
  text,                // the text between tags
  numeric_literal,     // 123, 1.5, -2 (a sign directly before digits where no operand precedes)
  string_literal,      // the unescaped contents of '...' or "..."
  identifier,          // names and keywords alike
  equals,              // =
  open_paren,          // (
  close_paren,         // )
  open_statement,      // {%
  close_statement,     // %}
  open_expression,     // {{
  close_expression,    // }}
  open_square,         // [
  close_square,        // ]
  open_curly,          // {
  close_curly,         // }
  comma,               // ,
  dot,                 // .
  colon,               // :
  pipe,                // |
  additive,            // + - ~
  multiplicative,      // * / // %
  exponent,            // **
  comparison,          // < > <= >= == !=
  unary,               // a sign before a non-number where no operand precedes
  comment,             // {# ... #}
};

struct token {
  token_kind kind = token_kind::text;
  std::string value;
  std::uint32_t line = 0;    // where the token starts in the original source, 1-based
  std::uint32_t column = 0;  // 1-based, in code points
};

struct lex_options {
  bool trim_blocks = true;    // drop the first newline after a block tag
  bool lstrip_blocks = true;  // drop spaces and tabs from the start of a line up to a block tag
};

// The source after the whitespace settings are applied, and for each byte of it the offset in the
// source it came from (for error positions).
struct preprocessed_source {
  std::string text;
  std::vector<std::uint32_t> origin;
};
preprocessed_source preprocess(std::string_view source, const lex_options& options);

// Tokens of a source that is valid UTF-8 (chat_template::parse repairs it first). Sources of 4 GiB
// and more are refused.
result<std::vector<token>, template_error> tokenize(std::string_view source, const lex_options& options = {});

}  // namespace troupe::text::jinja

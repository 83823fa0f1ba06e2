#pragma once
// The Jinja parser: tokens to a syntax tree, with @huggingface/jinja's grammar and precedence (or,
// and, not, comparisons and `in`, + - ~, * / // %, **, `is` tests, `|` filters, unary signs, calls
// and member access). Beyond the reference it accepts test arguments (`x is divisibleby(3)`,
// `x is divisibleby 3`) and member access or calls after a filter (`x | join(",") | upper`).
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/jinja/ast.hpp"
#include "engine/text/jinja/lexer.hpp"
#include "engine/text/template_error.hpp"

namespace troupe::text::jinja {

struct parse_options {
  // How deeply statements and expressions may nest (parentheses, blocks, operator chains); deeper
  // sources are refused with a syntax error, so walking the tree never exhausts the stack.
  int max_depth = 200;
};

result<program, template_error> parse(const std::vector<token>& tokens, const parse_options& options = {});

// Tokenizes and parses a source (valid UTF-8) with Hugging Face's whitespace settings.
result<program, template_error> parse_source(std::string_view source, const parse_options& options = {});

}  // namespace troupe::text::jinja

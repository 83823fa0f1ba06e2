#pragma once
// Regular expressions to GBNF: the grammar accepts exactly the strings the expression matches in full
// (as if anchored at both ends). The syntax is the common subset of ECMAScript and Python: literals,
// `.`, classes, the escapes \d \w \s (ASCII) and their negations, groups, alternation and greedy or lazy
// quantifiers. Constructs that are not regular or depend on the match position (backreferences,
// lookarounds, word boundaries, inner anchors, flags) are refused as unsupported, never dropped.
#include <string>
#include <string_view>

#include "engine/core/result.hpp"
#include "engine/guide/guide_error.hpp"

namespace troupe::guide {

// GBNF rules (root rule named `root_name`, helper rules prefixed by it) accepting exactly the strings
// the regular expression matches in full.
result<std::string, guide_error> regex_to_gbnf(std::string_view pattern, std::string_view root_name = "root");

// What the matched characters are written as.
enum class regex_alphabet : unsigned char {
  text,         // the characters themselves
  json_string,  // inside a JSON string literal: `"`, `\` and control characters in their JSON escapes
};

// The bound of a {m,n} count (and of m): past it the expression is too_large.
inline constexpr int regex_max_repeat = 1000;

// One GBNF expression (no rule definitions; it may hold top-level `|`, so wrap it in parentheses
// before following it with anything) for the expression's full matches, for generators that embed a
// pattern in a larger grammar (JSON schema's `pattern`). An empty result is the empty string.
result<std::string, guide_error> regex_to_gbnf_expression(std::string_view pattern,
                                                          regex_alphabet alphabet = regex_alphabet::text);

}  // namespace troupe::guide

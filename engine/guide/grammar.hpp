#pragma once
// A context-free grammar over bytes: what every guide (a GBNF grammar, a regular expression, a JSON
// schema, a choice list) compiles to before the matcher runs it. The source language is llama.cpp's
// GBNF (`name ::= alternatives`, "literals", [classes] over code points, `.`, groups, `* + ? {m,n}`,
// `#` comments), so grammars written for llama.cpp's `grammar` field work unchanged. Character classes
// are lowered to their UTF-8 byte sequences, so the matcher steps one byte at a time and a token that
// ends inside a multi-byte character is judged like any other prefix.
//
// The form is flat, as llama.cpp keeps it: every alternative is a run of elements closed by an `end`
// element, a rule is the list of its alternatives' start positions. Repetition is rewritten into
// right-recursive helper rules (`x*` is `r ::= x r | `), so the matcher's stacks stay bounded for it.
// Left recursion (a rule that reaches itself without consuming a byte) is refused at parse time: the
// pushdown matcher would not end on it.
#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/guide/guide_error.hpp"

namespace troupe::guide {

using byte_set = std::bitset<256>;

struct element {
  enum class kind : std::uint8_t { bytes, rule, end };
  kind k = kind::end;
  std::uint32_t index = 0;  // bytes: a set of `sets`; rule: a rule id
};

struct grammar {
  std::vector<element> flat;                     // every alternative, each closed by an `end`
  std::vector<std::vector<std::uint32_t>> alts;  // rule id -> its alternatives' start positions in flat
  std::vector<std::string> names;                // rule id -> name (generated rules: "name~3")
  std::vector<byte_set> sets;
  std::uint32_t root = 0;
};

struct grammar_limits {
  std::size_t max_source_bytes = 4u << 20;
  std::size_t max_elements = 2u << 20;  // of the flat form, after repetitions are unrolled
  std::uint32_t max_repeat = 10000;      // the largest count of a {m,n}
};

// `root` names the start rule.
result<grammar, guide_error> parse_gbnf(std::string_view text, std::string_view root = "root",
                                        const grammar_limits& limits = {});

// The whole text is a sentence of the grammar.
bool matches(const grammar& g, std::string_view text);
// Some continuation of text is a sentence (the empty continuation included).
bool viable_prefix(const grammar& g, std::string_view text);

// GBNF text of a literal (quoted and escaped), for generators.
std::string gbnf_literal(std::string_view bytes);

}  // namespace troupe::guide

// The GBNF parser and the byte-level matcher: what a grammar accepts, rejects and refuses, including
// llama.cpp's own json.gbnf, multi-byte classes, bounded repetition and left recursion.
#include <gtest/gtest.h>

#include "engine/guide/automaton.hpp"
#include "engine/guide/grammar.hpp"

namespace troupe::guide {
namespace {

grammar parse_ok(std::string_view text) {
  auto g = parse_gbnf(text);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message());
  return g ? *g : grammar{};
}

guide_error parse_fails(std::string_view text) {
  auto g = parse_gbnf(text);
  EXPECT_FALSE(g.has_value()) << text;
  return g ? guide_error{} : g.error();
}

// llama.cpp's grammars/json.gbnf, as people pass it in the `grammar` field.
constexpr std::string_view json_gbnf = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(grammar, literals_alternatives_and_groups) {
  auto g = parse_ok(R"(root ::= "yes" | "no" | ("may" "be"))");
  EXPECT_TRUE(matches(g, "yes"));
  EXPECT_TRUE(matches(g, "no"));
  EXPECT_TRUE(matches(g, "maybe"));
  EXPECT_FALSE(matches(g, "ye"));
  EXPECT_TRUE(viable_prefix(g, "ye"));
  EXPECT_TRUE(viable_prefix(g, ""));
  EXPECT_FALSE(viable_prefix(g, "yes!"));
  EXPECT_FALSE(matches(g, ""));
}

TEST(grammar, classes_over_code_points_step_by_bytes) {
  auto g = parse_ok(R"(root ::= [a-cé-ë€😀] [^a-z]*)");
  EXPECT_TRUE(matches(g, "a"));
  EXPECT_TRUE(matches(g, "\xC3\xA9"));          // é
  EXPECT_TRUE(matches(g, "\xC3\xAB"));          // ë
  EXPECT_FALSE(matches(g, "\xC3\xAC"));         // ì
  EXPECT_TRUE(matches(g, "\xE2\x82\xAC"));      // €
  EXPECT_TRUE(matches(g, "\xF0\x9F\x98\x80"));  // 😀
  EXPECT_FALSE(matches(g, "\xF0\x9F\x98\x81")); // 😁
  EXPECT_TRUE(viable_prefix(g, "\xE2\x82"));    // a token ending inside a character
  EXPECT_FALSE(viable_prefix(g, "\xE2\x83"));
  // The negated class takes any code point but a-z, multi-byte ones included, never a bare
  // continuation byte or a surrogate's encoding.
  EXPECT_TRUE(matches(g, "bXYZ\xE4\xB8\xAD 9"));
  EXPECT_FALSE(matches(g, "bXq"));
  EXPECT_FALSE(viable_prefix(g, "b\x80"));
  EXPECT_FALSE(viable_prefix(g, "b\xED\xA0\x80"));  // U+D800 encoded
  EXPECT_TRUE(matches(g, "b\xF4\x8F\xBF\xBF"));     // U+10FFFF
  EXPECT_FALSE(viable_prefix(g, "b\xF4\x90"));      // past U+10FFFF
}

TEST(grammar, dot_escapes_and_comments) {
  auto g = parse_ok("# a comment\nroot ::= \"\\x41\\u00e9\\n\" . # trailing\n");
  EXPECT_TRUE(matches(g, "A\xC3\xA9\nz"));
  EXPECT_TRUE(matches(g, "A\xC3\xA9\n\xE4\xB8\xAD"));
  EXPECT_TRUE(matches(g, "A\xC3\xA9\n\n"));  // llama.cpp's `.` takes any character, newlines too
  EXPECT_FALSE(matches(g, "A\xC3\xA9\nzz"));
}

TEST(grammar, repetition_counts_are_exact) {
  auto g = parse_ok(R"(root ::= "a"{2,4} "b"{3} "c"{1,} "d"? "e"*)");
  EXPECT_FALSE(matches(g, "abbbc"));
  EXPECT_TRUE(matches(g, "aabbbc"));
  EXPECT_TRUE(matches(g, "aaaabbbccccde"));
  EXPECT_FALSE(matches(g, "aaaaabbbc"));
  EXPECT_FALSE(matches(g, "aabbc"));
  EXPECT_FALSE(matches(g, "aabbbbc"));
  EXPECT_FALSE(matches(g, "aabbb"));
  EXPECT_TRUE(matches(g, "aabbbceeee"));
  EXPECT_FALSE(matches(g, "aabbbcdd"));
  auto h = parse_ok(R"(root ::= ("ab" | "c"){0,3} "!")");
  EXPECT_TRUE(matches(h, "!"));
  EXPECT_TRUE(matches(h, "abcab!"));
  EXPECT_FALSE(matches(h, "abcabc!"));
  auto k = parse_ok("root ::= [0-9]{3,}");
  EXPECT_FALSE(matches(k, "12"));
  EXPECT_TRUE(matches(k, "123456789012"));
}

TEST(grammar, llama_cpp_json_gbnf) {
  auto g = parse_ok(json_gbnf);
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5, -3e12, "x\"y\u00e9", true, null], "b": {}})"));
  EXPECT_TRUE(matches(g, "{\n  \"k\": \"v\"\n}"));
  EXPECT_TRUE(matches(g, R"({"deep": {"er": {"est": [[[]]]}}})"));
  EXPECT_FALSE(matches(g, R"({"a": [1, 2,]})"));
  EXPECT_FALSE(matches(g, R"({"a": 3e10})"));  // llama.cpp's json.gbnf: exponent digits after the first are [1-9]
  EXPECT_FALSE(matches(g, R"({"a" 1})"));
  EXPECT_FALSE(matches(g, "[1]"));  // root is an object
  EXPECT_FALSE(matches(g, "{\"a\": \"\x01\"}"));
  EXPECT_FALSE(matches(g, R"({"a": 01x})"));
  EXPECT_TRUE(viable_prefix(g, R"({"a": [1, {"b": "unfinished)"));
  EXPECT_FALSE(viable_prefix(g, R"({"a": [1, })"));
}

TEST(grammar, nesting_does_not_blow_up_the_automaton) {
  auto g = std::make_shared<const grammar>(parse_ok(json_gbnf));
  automaton a(g);
  std::string text = "{\"a\": ";
  for (int k = 0; k < 40; ++k) text += "[";
  for (int k = 0; k < 40; ++k) text += "]";
  text += "}";
  auto s = a.next(a.start(), text);
  EXPECT_TRUE(a.accepting(s));
  // A long string reuses one state per byte class.
  const auto before = a.states();
  auto t = a.next(a.start(), "{\"k\": \"" + std::string(5000, 'x') + "\"}");
  EXPECT_TRUE(a.accepting(t));
  EXPECT_LT(a.states() - before, 40u);
}

TEST(grammar, right_recursion_and_mutual_recursion) {
  auto g = parse_ok("root ::= item (\",\" item)*\nitem ::= \"(\" root \")\" | [a-z]+\n");
  EXPECT_TRUE(matches(g, "a,(b,(c,d)),e"));
  EXPECT_FALSE(matches(g, "a,(b"));
  EXPECT_TRUE(viable_prefix(g, "a,(b"));
}

TEST(grammar, empty_alternatives_and_nullable_rules) {
  auto g = parse_ok("root ::= opt \"x\" opt\nopt ::= | \"o\"\n");
  EXPECT_TRUE(matches(g, "x"));
  EXPECT_TRUE(matches(g, "oxo"));
  EXPECT_FALSE(matches(g, "oox"));
}

TEST(grammar, refusals_are_typed) {
  EXPECT_EQ(parse_fails("root ::= missing").code, guide_error_code::undefined_rule);
  EXPECT_EQ(parse_fails("start ::= \"a\"").code, guide_error_code::undefined_rule);  // no root
  EXPECT_EQ(parse_fails("root ::= root \"a\" | \"b\"").code, guide_error_code::left_recursion);
  EXPECT_EQ(parse_fails("root ::= e \"x\"\ne ::= | root").code, guide_error_code::left_recursion);
  EXPECT_EQ(parse_fails("root ::= (\"a\"?)*").code, guide_error_code::left_recursion);
  EXPECT_EQ(parse_fails("root ::= \"abc").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root ::= [a-").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root ::= [z-a]").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root ::= (\"a\"").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root \"a\"").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root ::= *").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root ::= \"a\"{3,2}").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root ::= \"\\q\"").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root ::= \"a\"\nroot ::= \"b\"").code, guide_error_code::bad_grammar);
  EXPECT_EQ(parse_fails("root ::= \"a\"{1000000}").code, guide_error_code::too_large);
  EXPECT_EQ(parse_fails("root ::= \"\xC3\"").code, guide_error_code::bad_grammar);  // invalid UTF-8
  // Unrolling is bounded by elements, not only by counts.
  grammar_limits small;
  small.max_elements = 100;
  auto g = parse_gbnf("root ::= \"a\"{50} \"b\"{60}", "root", small);
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.error().code, guide_error_code::too_large);
}

TEST(grammar, literal_helper_round_trips) {
  const std::string nasty = "q\"uo\\te\n\t\x01 \xC3\xA9";
  auto g = parse_ok("root ::= " + gbnf_literal(nasty));
  EXPECT_TRUE(matches(g, nasty));
  EXPECT_FALSE(matches(g, nasty + "x"));
}

}  // namespace
}  // namespace troupe::guide

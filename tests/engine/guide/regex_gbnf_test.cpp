// Regular expressions to GBNF: the grammar accepts exactly the strings the expression matches in full.
// Each language is checked through the matcher, and small alphabets exhaustively against std::regex.
#include "engine/guide/regex_gbnf.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <regex>

#include "engine/guide/grammar.hpp"

namespace troupe::guide {
namespace {

std::optional<grammar> compile(std::string_view pattern) {
  auto text = regex_to_gbnf(pattern);
  EXPECT_TRUE(text.has_value()) << pattern << ": " << (text ? "" : text.error().message());
  if (!text) return std::nullopt;
  auto g = parse_gbnf(*text);
  EXPECT_TRUE(g.has_value()) << pattern << ":\n" << *text << (g ? "" : g.error().message());
  if (!g) return std::nullopt;
  return *g;
}

void expect_language(std::string_view pattern, std::initializer_list<std::string_view> yes,
                     std::initializer_list<std::string_view> no) {
  const auto g = compile(pattern);
  if (!g) return;
  for (auto s : yes) EXPECT_TRUE(matches(*g, s)) << pattern << " should accept '" << s << "'";
  for (auto s : no) EXPECT_FALSE(matches(*g, s)) << pattern << " should reject '" << s << "'";
}

guide_error refused(std::string_view pattern) {
  auto text = regex_to_gbnf(pattern);
  EXPECT_FALSE(text.has_value()) << pattern << " was accepted:\n" << (text ? *text : "");
  return text ? guide_error{} : text.error();
}

TEST(regex_gbnf, literals_including_multi_byte_characters) {
  expect_language("héllo日本😀", {"héllo日本😀"}, {"hello日本😀", "héllo日本", "", "héllo日本😀!"});
  expect_language("", {""}, {"a"});
  expect_language(R"(a"b\\c)", {R"(a"b\c)"}, {R"(a"b\\c)", "abc"});
}

TEST(regex_gbnf, phone_numbers) {
  expect_language(R"(^\(?\d{3}\)?[-. ]?\d{3}[-. ]?\d{4}$)",
                  {"(555) 123-4567", "555-123-4567", "555.123.4567", "5551234567", "(555)1234567"},
                  {"555-1234-567", "55-123-4567", "555-123-45678", "abc-def-ghij", "555_123_4567", ""});
  expect_language(R"(\+1 \d{3}-\d{4})", {"+1 555-0100"}, {"1 555-0100", "+1 5550-100"});
}

TEST(regex_gbnf, email_like) {
  expect_language(R"([a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,})",
                  {"john.doe@example.com", "a+b@x.io", "x@y.museum"},
                  {"john@example", "@example.com", "John@example.com", "a@b.c", "a b@c.de"});
}

TEST(regex_gbnf, alternation_groups_and_named_groups) {
  expect_language("(cat|dog)s?|bird", {"cat", "dogs", "bird", "cats"}, {"birds", "catdog", "", "do"});
  expect_language("(?:ab|cd)+", {"ab", "abcd", "cdcdab"}, {"", "abc", "ac"});
  expect_language("(?<year>[0-9]{4})-(?P<month>[0-9]{2})", {"2024-05"}, {"2024-5", "24-05"});
  expect_language("a|", {"a", ""}, {"aa"});
  expect_language("(|a|b)c", {"c", "ac", "bc"}, {"abc", ""});
}

TEST(regex_gbnf, classes_and_negated_classes_with_multi_byte_characters) {
  expect_language("[a-fA-F0-9]+", {"deadBEEF", "0"}, {"", "g", "dead beef"});
  expect_language("[^aé]", {"b", "日", "😀", "\n", "e"}, {"a", "é", "", "bb"});
  expect_language("[^0-9]*", {"", "abc", "日本語"}, {"a1", "9"});
  expect_language("[é-ë]", {"é", "ê", "ë"}, {"e", "è", "ì"});
  expect_language("[-a]", {"-", "a"}, {"b"});
  expect_language("[a-]", {"-", "a"}, {"b"});
  expect_language("[]a]", {"]", "a"}, {"b"});
  expect_language(R"([\d.]+)", {"3.14", "..."}, {"3,14"});
  expect_language(R"([^\s])", {"x", "日"}, {" ", "\t", "\n"});
  expect_language("[😀-😂]", {"😀", "😁", "😂"}, {"😃", "a"});
}

TEST(regex_gbnf, dot_is_any_code_point_but_newline) {
  expect_language("a.c", {"abc", "a.c", "a日c", "a😀c", "a\tc"}, {"ac", "a\nc", "abbc"});
}

TEST(regex_gbnf, escapes) {
  expect_language(R"(\d\D\w\W\s\S)", {"1a_ \tx", "9Zz-\nx"}, {"aa_ \tx", "1a_ xx"});
  expect_language(R"(\t\n\r\\\.\*\+\?\(\)\[\]\{\}\|\^\$\/)", {"\t\n\r\\.*+?()[]{}|^$/"}, {"x"});
  expect_language(R"(\x41\u00e9\u{1F600}\uD83D\uDE01)", {"Aé😀😁"}, {"A\\xe9"});
  expect_language(R"([\x41-\x43]\0)", {std::string_view("B\0", 2)}, {"B0", "D\0"});
  expect_language("a{b", {"a{b"}, {"ab"});
  expect_language("a{,2}", {"", "a", "aa"}, {"aaa", "a{,2}"});
}

TEST(regex_gbnf, quantifier_bounds) {
  expect_language("a{3}", {"aaa"}, {"aa", "aaaa"});
  expect_language("a{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"});
  expect_language("a{2,}", {"aa", "aaaaaaaaaa"}, {"a", ""});
  expect_language("(ab){2}c?", {"abab", "ababc"}, {"ab", "abababc"});
  expect_language("a+?b*?c??", {"a", "aab", "abbc"}, {"b", "acc"});
  expect_language("x{0}y", {"y"}, {"xy"});
  expect_language("[0-9]{1,1000}", {"0", std::string(1000, '7')}, {std::string(1001, '7'), ""});
}

TEST(regex_gbnf, repeated_nullable_groups_are_not_left_recursive) {
  expect_language("(a?)*", {"", "a", "aaaa"}, {"b"});
  expect_language("(a|)+b", {"b", "ab", "aaab"}, {"ba"});
  expect_language("(a*b*)*c", {"c", "abc", "bbaac"}, {"ca"});
  expect_language("()*x", {"x"}, {"xx"});
  expect_language("(a?b?){2,3}", {"", "ab", "abab", "ababab", "ba"}, {"abababab", "c"});
  expect_language("((a?)(b?))+$", {"", "aabb", "ba"}, {"c"});
}

TEST(regex_gbnf, anchors_only_at_the_ends) {
  expect_language("^abc$", {"abc"}, {"ab", "abcd"});
  expect_language("^a|b$", {"a", "b"}, {"ab"});
  EXPECT_EQ(refused("a^b").code, guide_error_code::unsupported);
  EXPECT_EQ(refused("a$b").code, guide_error_code::unsupported);
  EXPECT_EQ(refused("(^a)").code, guide_error_code::unsupported);
  EXPECT_EQ(refused("(a$)").code, guide_error_code::unsupported);
}

TEST(regex_gbnf, refuses_what_is_not_regular_or_position_dependent) {
  for (auto p : {R"((a)\1)", "(?=a)a", "(?!a)b", "(?<=a)b", "(?<!a)b", R"(\bword\b)", "(?i)abc", R"(\p{L})",
                 "(?P<x>a)(?P=x)", R"(\k<x>)", "a++", R"(\Aa)"})
    EXPECT_EQ(refused(p).code, guide_error_code::unsupported) << p;
  EXPECT_EQ(refused("[^\\s\\S]").code, guide_error_code::unsupported);  // matches no character
}

TEST(regex_gbnf, refuses_malformed_expressions_with_their_offset) {
  for (auto p : {"(ab", "ab)", "a**", "*a", "+", "[z-a]", "a{5,2}", "[abc", "abc\\", R"(\q)", R"(\x4)", R"(\u12)",
                 "a{2}{3}", "(?<>a)"})
    EXPECT_EQ(refused(p).code, guide_error_code::bad_regex) << p;
  EXPECT_EQ(refused("\xff").code, guide_error_code::bad_regex);
  EXPECT_EQ(refused("ab)").where, "at 2");
}

TEST(regex_gbnf, bounds_counts_and_their_product) {
  EXPECT_EQ(refused("a{1001}").code, guide_error_code::too_large);
  EXPECT_EQ(refused("a{2,1001}").code, guide_error_code::too_large);
  EXPECT_EQ(refused("(a{1000}){1000}").code, guide_error_code::too_large);
  EXPECT_EQ(refused(std::string(300, '(') + "a" + std::string(300, ')')).code, guide_error_code::too_large);
  expect_language(std::string(150, '(') + "a" + std::string(150, ')'), {"a"}, {"aa"});
}

TEST(regex_gbnf, root_name_and_json_string_alphabet) {
  auto text = regex_to_gbnf("[0-9]+", "digits");
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(text->rfind("digits ::= ", 0), 0u);
  auto g = parse_gbnf(*text, "digits");
  ASSERT_TRUE(g.has_value()) << g.error().message();
  EXPECT_TRUE(matches(*g, "42"));
  EXPECT_EQ(regex_to_gbnf("a", "bad name").error().code, guide_error_code::bad_grammar);

  // Inside a JSON string, `"`, `\` and control characters are written as JSON escapes.
  auto e = regex_to_gbnf_expression("a.b|q[\"\\\\]", regex_alphabet::json_string);
  ASSERT_TRUE(e.has_value()) << e.error().message();
  auto j = parse_gbnf("root ::= \"\\\"\" (" + *e + ") \"\\\"\"\n");
  ASSERT_TRUE(j.has_value()) << *e << "\n" << j.error().message();
  for (auto s : {R"("axb")", R"("a\"b")", R"("a\\b")", R"("a\tb")", R"("a\u0009b")", R"("a\u001fb")", R"("a\u001Fb")",
                 R"("a日b")", R"("q\"")", R"("q\\")"})
    EXPECT_TRUE(matches(*j, s)) << s;
  for (auto s : {R"("a"b")", R"("a\b")", R"("a\nb")", R"("a\u000ab")", "\"a\tb\"", R"("q"")", R"("q\")"})
    EXPECT_FALSE(matches(*j, s)) << s;
}

// Every string over a small alphabet up to a length, against std::regex's full match.
TEST(regex_gbnf, agrees_with_std_regex_on_every_short_string) {
  const char* patterns[] = {"(a|b)*c", "a{1,2}b?", "(ab|a)*", "[^a]+", "a*?b", "(a?b?)+c?", "(a|bc){2,3}",
                            "((a|b)c)?", "a(b|c{2})*a|c", "[ab]{2}[^b]{0,2}", "(a*)*b?", ".{2}a"};
  std::vector<std::string> words{""};
  for (std::size_t i = 0; i < words.size(); ++i)
    if (words[i].size() < 5)
      for (char c : std::string("abc")) words.push_back(words[i] + c);
  for (const char* p : patterns) {
    const auto g = compile(p);
    ASSERT_TRUE(g);
    const std::regex re(p, std::regex::ECMAScript);
    for (const auto& w : words) EXPECT_EQ(matches(*g, w), std::regex_match(w, re)) << p << " on '" << w << "'";
  }
}

}  // namespace
}  // namespace troupe::guide

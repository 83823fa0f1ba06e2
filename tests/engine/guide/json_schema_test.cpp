// JSON schemas to GBNF: through the matcher, valid instances are accepted and invalid ones refused
// (integer and number bounds exhaustively over ranges), and schemas troupe cannot honour are typed
// errors that name the keyword and where it is.
#include "engine/guide/json_schema.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/guide/grammar.hpp"

namespace troupe::guide {
namespace {

std::optional<grammar> compile(std::string_view schema) {
  auto text = json_schema_to_gbnf(schema);
  EXPECT_TRUE(text.has_value()) << schema << ": " << (text ? "" : text.error().message());
  if (!text) return std::nullopt;
  auto g = parse_gbnf(*text);
  EXPECT_TRUE(g.has_value()) << schema << ":\n" << *text << (g ? "" : g.error().message());
  if (!g) return std::nullopt;
  return *g;
}

void expect_language(std::string_view schema, std::initializer_list<std::string_view> valid,
                     std::initializer_list<std::string_view> invalid) {
  const auto g = compile(schema);
  if (!g) return;
  for (auto s : valid) EXPECT_TRUE(matches(*g, s)) << schema << " should accept " << s;
  for (auto s : invalid) EXPECT_FALSE(matches(*g, s)) << schema << " should reject " << s;
}

guide_error refused(std::string_view schema) {
  auto text = json_schema_to_gbnf(schema);
  EXPECT_FALSE(text.has_value()) << schema << " was accepted:\n" << (text ? *text : "");
  return text ? guide_error{} : text.error();
}

void expect_refused(std::string_view schema, guide_error_code code, std::string_view where) {
  const auto e = refused(schema);
  EXPECT_EQ(e.code, code) << schema << ": " << e.message();
  EXPECT_EQ(e.where, where) << schema << ": " << e.message();
}

TEST(json_schema, primitive_types) {
  expect_language(R"({"type":"string"})", {R"("")", R"("a b")", R"("\"\\\/\b\f\n\r\t\u00e9")", R"("日本😀")"},
                  {R"("a)", R"("a"b")", "\"a\tb\"", R"("\x")", R"("\u12")", "a", "1"});
  expect_language(R"({"type":"number"})", {"0", "-0", "1.5", "-12.25e+10", "3E-2", "10"},
                  {"01", "1.", ".5", "+1", "1e", "--1", "NaN", "\"1\""});
  expect_language(R"({"type":"integer"})", {"0", "-7", "123456789012345678901234567890"}, {"1.0", "01", "1e3", "-"});
  expect_language(R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null"});
  expect_language(R"({"type":"null"})", {"null"}, {"nul", "\"null\""});
}

TEST(json_schema, empty_schema_and_true_are_any_value) {
  for (auto schema : {"{}", "true", R"({"description":"anything"})"})
    expect_language(schema, {"1", "\"x\"", "null", R"({"a":[1,{"b":null}]})", "[]", "true"}, {"", "{", "[1,]", "nul"});
}

TEST(json_schema, nested_objects_in_declared_order) {
  constexpr auto schema = R"({"type":"object","properties":{
      "name":{"type":"string"},
      "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"integer"}},"required":["city","zip"]}},
    "required":["name","address"]})";
  expect_language(schema, {R"({"name":"Ann","address":{"city":"Oslo","zip":150}})",
                           R"({"name": "Ann", "address": {"city": "Oslo", "zip": 150}})",
                           "{\n  \"name\": \"Ann\",\n  \"address\": {\n    \"city\": \"Oslo\",\n    \"zip\": 150\n  }\n}"},
                  {R"({"address":{"city":"Oslo","zip":150},"name":"Ann"})", R"({"name":"Ann","address":{"city":"Oslo"}})",
                   R"({"name":"Ann","address":{"city":"Oslo","zip":"150"}})", R"({"name":"Ann"})",
                   R"({"name":"Ann","address":{"city":"Oslo","zip":150},"extra":1})"});
}

// Four properties, b and d required: every subset in declared order is accepted iff it has b and d.
TEST(json_schema, optional_properties_every_subset) {
  const auto g = compile(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
      "c":{"type":"integer"},"d":{"type":"integer"}},"required":["d","b"]})");
  ASSERT_TRUE(g);
  const std::string keys = "abcd";
  for (int mask = 0; mask < 16; ++mask) {
    std::string text = "{";
    for (int i = 0; i < 4; ++i)
      if (mask & (1 << i)) text += std::string(text.size() > 1 ? "," : "") + "\"" + keys[static_cast<std::size_t>(i)] + "\":" + std::to_string(i);
    text += "}";
    EXPECT_EQ(matches(*g, text), (mask & 2) && (mask & 8)) << text;
  }
  EXPECT_FALSE(matches(*g, R"({"b":1,,"d":2})"));
  EXPECT_FALSE(matches(*g, R"({,"b":1,"d":2})"));
  EXPECT_FALSE(matches(*g, R"({"b":1,"d":2,})"));
  EXPECT_FALSE(matches(*g, R"({"d":2,"b":1})"));

  // All optional: the empty object and each single one.
  expect_language(R"({"properties":{"x":{"type":"boolean"},"y":{"type":"null"}}})",
                  {"{}", R"({"x":true})", R"({"y":null})", R"({"x":false,"y":null})"},
                  {R"({"y":null,"x":true})", R"({"z":1})", "[]"});
}

TEST(json_schema, additional_properties) {
  // Absent: false once properties are declared (OpenAI strict mode); {"type":"object"} alone: any object.
  expect_language(R"({"type":"object","properties":{"a":{"type":"integer"}}})", {R"({"a":1})", "{}"}, {R"({"a":1,"b":2})"});
  expect_language(R"({"type":"object"})", {"{}", R"({"k":[1,{"z":null}],"j":"x"})"}, {"[]", "1"});
  expect_language(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})",
                  {R"({"a":1,"b":"x","c":[]})", R"({"b":null})", "{}"}, {R"({"a":"x"})", R"({"a":1,"a":2})"});
  constexpr auto typed = R"({"type":"object","properties":{"id":{"type":"integer"},"ab":{"type":"string"}},
      "required":["id"],"additionalProperties":{"type":"number","minimum":0}})";
  expect_language(typed, {R"({"id":1})", R"({"id":1,"x":2.5})", R"({"id":1,"ab":"s","x":2,"i":0,"idx":3,"a":1,"abc":4,"":5})"},
                  {R"({"id":1,"x":-1})", R"({"id":1,"x":"s"})", R"({"x":1})", R"({"id":1,"id":2})", R"({"id":1,"ab":1})",
                   R"({"id":1,"x":1,"ab":"s"})"});
  // A map: only additionalProperties.
  expect_language(R"({"type":"object","additionalProperties":{"type":"boolean"}})",
                  {"{}", R"({"a":true})", R"({"a":true,"b":false})"}, {R"({"a":1})"});
}

TEST(json_schema, arrays_with_item_counts) {
  const auto g = compile(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":4})");
  ASSERT_TRUE(g);
  for (int n = 0; n <= 6; ++n) {
    std::string text = "[";
    for (int i = 0; i < n; ++i) text += (i ? "," : "") + std::to_string(i);
    EXPECT_EQ(matches(*g, text + "]"), n >= 2 && n <= 4) << text;
  }
  EXPECT_FALSE(matches(*g, R"([1,"2"])"));
  expect_language(R"({"type":"array"})", {"[]", R"([1,"a",[null]])"}, {"[1,]", "{}"});
  expect_language(R"({"type":"array","items":{"type":"string"},"minItems":1})", {R"(["a"])", R"(["a", "b"])"}, {"[]", "[1]"});
  expect_language(R"({"type":"array","maxItems":0})", {"[]", "[ ]"}, {"[1]"});
}

TEST(json_schema, tuples_prefix_items_and_draft4_items) {
  constexpr auto strict = R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})";
  expect_language(strict, {"[]", R"(["a"])", R"(["a",1])"}, {R"(["a",1,2])", "[1]", R"(["a","b"])"});
  constexpr auto open = R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"boolean"},"minItems":2})";
  expect_language(open, {R"(["a",true])", R"(["a",true,false])"}, {R"(["a"])", R"(["a",1])", R"([true,true])"});
  constexpr auto draft4 = R"({"type":"array","items":[{"type":"null"},{"type":"integer"}],"additionalItems":false,"minItems":1})";
  expect_language(draft4, {"[null]", "[null,2]"}, {"[]", "[null,2,3]", "[1]"});
}

TEST(json_schema, enum_of_mixed_values_and_const) {
  constexpr auto schema = R"({"enum":["red",42,null,true,{"a":[1,"b"]},[1,2],1.5,"日本"]})";
  expect_language(schema, {R"("red")", "42", "null", "true", R"({"a":[1,"b"]})", "[1,2]", "1.5", R"("日本")", R"("red" )"},
                  {R"("blue")", "43", "false", R"({"a":[1,"c"]})", "[1, 2]", "1.50", "red"});
  expect_language(R"({"type":"string","enum":["a",1,"b"]})", {R"("a")", R"("b")"}, {"1"});
  expect_language(R"({"const":{"k":"v"}})", {R"({"k":"v"})"}, {R"({"k":"w"})", "{}"});
  expect_language(R"({"const":"x","nullable":true})", {R"("x")", "null"}, {R"("y")"});
}

TEST(json_schema, string_lengths_count_characters_not_bytes) {
  constexpr auto schema = R"({"type":"string","minLength":2,"maxLength":3})";
  expect_language(schema, {R"("ab")", R"("abc")", R"("éé")", R"("日本語")", R"("😀😀")", R"("a\nb")", R"("\u00e9\"")"},
                  {R"("a")", R"("é")", R"("abcd")", R"("日本語x")", R"("😀")", R"("😀😀😀😀")", R"("")"});
  expect_language(R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"});
  expect_language(R"({"type":"string","minLength":1})", {R"("a")", R"("日本語日本語")"}, {R"("")"});
}

TEST(json_schema, string_patterns_match_the_whole_value) {
  expect_language(R"({"type":"string","pattern":"^[0-9]{3}-[0-9]{4}$"})", {R"("555-1234")"},
                  {R"("555-12345")", R"("x555-1234")", R"("5551234")", "555-1234"});
  expect_language(R"({"type":"string","pattern":"[a-z]+"})", {R"("abc")"}, {R"("abc1")", R"("")"});
  // The characters of the value in their JSON spelling: a quote escaped, no raw control character.
  expect_language(R"({"type":"string","pattern":"^a.b$"})", {R"("a\"b")", R"("a\\b")", R"("a\tb")", R"("a日b")"},
                  {R"("a"b")", R"("a\nb")", "\"a\tb\"", R"("ab")"});
  expect_language(R"({"type":"object","properties":{"code":{"type":"string","pattern":"^(AB|CD)-\\d+$"}},"required":["code"]})",
                  {R"({"code":"AB-12"})"}, {R"({"code":"AC-12"})", R"({"code":"AB-"})"});
}

TEST(json_schema, formats) {
  // Each month's length and February 29 in leap years only, as ajv's "date" format checks them.
  expect_language(R"({"type":"string","format":"date"})",
                  {R"("2024-02-29")", R"("1999-12-31")", R"("2000-02-29")", R"("0000-02-29")", R"("1996-02-29")", R"("2023-11-30")",
                   R"("2023-08-31")", R"("2023-02-28")"},
                  {R"("2024-13-01")", R"("2024-00-10")", R"("2024-01-32")", R"("24-01-01")", R"("2024-1-01")", R"("6848-11-31")",
                   R"("2023-02-29")", R"("1900-02-29")", R"("2023-04-31")", R"("2023-02-30")", R"("2023-06-31")"});
  expect_language(R"({"type":"string","format":"time"})", {R"("23:59:59Z")", R"("00:00:00.123+05:30")", R"("12:00:60z")"},
                  {R"("24:00:00Z")", R"("12:60:00Z")", R"("12:00:00")", R"("12:00Z")"});
  expect_language(R"({"type":"string","format":"date-time"})", {R"("2024-05-01T12:30:00Z")", R"("2024-05-01t12:30:00.5-08:00")"},
                  {R"("2024-05-01 12:30:00Z")", R"("2024-05-01T12:30Z")"});
  expect_language(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-A456-426614174000")"},
                  {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400")", R"("g23e4567-e89b-12d3-a456-426614174000")"});
  expect_language(R"({"type":"string","format":"email"})", {R"("a@b.c")", R"("anything")"}, {"1"});
  expect_refused(R"({"type":"string","format":"ipv4"})", guide_error_code::unsupported, "/format");
}

// Accepted iff lo <= v <= hi, for every integer around the range; canonical spellings only.
void expect_integer_range(std::string_view schema, std::int64_t lo, std::int64_t hi, std::int64_t from, std::int64_t to, std::int64_t step = 1) {
  const auto g = compile(schema);
  ASSERT_TRUE(g);
  for (auto v = from; v <= to; v += step) EXPECT_EQ(matches(*g, std::to_string(v)), v >= lo && v <= hi) << schema << " on " << v;
  EXPECT_FALSE(matches(*g, "-0")) << schema;
  EXPECT_FALSE(matches(*g, "007")) << schema;
  EXPECT_FALSE(matches(*g, "1.0")) << schema;
}

TEST(json_schema, integer_ranges_are_exact) {
  expect_integer_range(R"({"type":"integer","minimum":0,"maximum":0})", 0, 0, -30, 30);
  expect_integer_range(R"({"type":"integer","minimum":-10,"maximum":10})", -10, 10, -150, 150);
  expect_integer_range(R"({"type":"integer","minimum":7,"maximum":123})", 7, 123, -20, 1200);
  expect_integer_range(R"({"type":"integer","minimum":-123,"maximum":-7})", -123, -7, -1200, 20);
  expect_integer_range(R"({"type":"integer","minimum":0,"maximum":1000})", 0, 1000, -20, 12000);
  expect_integer_range(R"({"type":"integer","minimum":99,"maximum":1001})", 99, 1001, 0, 12000);
  expect_integer_range(R"({"type":"integer","exclusiveMinimum":-3,"exclusiveMaximum":3})", -2, 2, -40, 40);
  expect_integer_range(R"({"type":"integer","minimum":-3,"exclusiveMinimum":true,"maximum":3,"exclusiveMaximum":true})", -2, 2, -40, 40);
  expect_integer_range(R"({"type":"integer","minimum":2.5,"maximum":7.9})", 3, 7, -20, 20);
  expect_integer_range(R"({"type":"integer","exclusiveMinimum":-0.5,"exclusiveMaximum":0.5})", 0, 0, -20, 20);
  expect_integer_range(R"({"type":"integer","minimum":-0.5,"maximum":0.7})", 0, 0, -20, 20);
  expect_integer_range(R"({"type":"integer","exclusiveMinimum":-1,"exclusiveMaximum":1})", 0, 0, -20, 20);
  expect_integer_range(R"({"type":"integer","exclusiveMinimum":-2,"exclusiveMaximum":0})", -1, -1, -20, 20);
  expect_integer_range(R"({"type":"integer","minimum":-9.5,"maximum":-0.5})", -9, -1, -30, 30);
  expect_integer_range(R"({"type":"integer","minimum":-1000,"maximum":1000000})", -1000, 1000000, -3000, 3000);
  expect_integer_range(R"({"type":"integer","minimum":-1000,"maximum":1000000})", -1000, 1000000, -10007, 3000000, 997);
  expect_integer_range(R"({"type":"integer","minimum":-1000,"maximum":1000000})", -1000, 1000000, 999000, 1001000);
  expect_integer_range(R"({"type":"integer","minimum":5})", 5, INT64_MAX, -100, 100000, 7);
  expect_integer_range(R"({"type":"integer","maximum":-5})", INT64_MIN, -5, -100000, 100, 7);
  expect_integer_range(R"({"type":"integer","exclusiveMaximum":0})", INT64_MIN, -1, -1000, 1000);
  expect_integer_range(R"({"type":"integer","minimum":12345,"maximum":67890})", 12345, 67890, 0, 100000, 3);
  expect_integer_range(R"({"type":"integer","minimum":123456789,"maximum":123456800})", 123456789, 123456800, 123456700, 123456900);
  const auto big = compile(R"({"type":"integer","minimum":1e20})");
  ASSERT_TRUE(big);
  EXPECT_TRUE(matches(*big, "100000000000000000000"));
  EXPECT_TRUE(matches(*big, "1000000000000000000000000"));
  EXPECT_FALSE(matches(*big, "99999999999999999999"));
  expect_refused(R"({"type":"integer","minimum":5,"maximum":4})", guide_error_code::unsupported, "");
  expect_refused(R"({"type":"integer","minimum":4.2,"maximum":4.8})", guide_error_code::unsupported, "");
}

// Decimal spellings of i / 1000 (i an integer): with 0 to 4 fraction digits where exact.
std::vector<std::pair<std::string, std::int64_t>> decimals(std::int64_t from, std::int64_t to) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (auto i = from; i <= to; ++i) {
    const auto mag = i < 0 ? -i : i;
    const std::string sign = i < 0 ? "-" : "", ip = std::to_string(mag / 1000);
    auto fp = std::to_string(mag % 1000);
    fp = std::string(3 - fp.size(), '0') + fp;
    out.emplace_back(sign + ip + "." + fp, i);
    out.emplace_back(sign + ip + "." + fp + "0", i);
    if (fp[2] == '0') out.emplace_back(sign + ip + "." + fp.substr(0, 2), i);
    if (fp.substr(1) == "00") out.emplace_back(sign + ip + "." + fp.substr(0, 1), i);
    if (fp == "000") out.emplace_back(sign + ip, i);
  }
  return out;
}

// Accepted iff the value (in thousandths) is within [lo, hi], each end inclusive or not.
void expect_number_range(std::string_view schema, std::int64_t lo, bool lo_x, std::int64_t hi, bool hi_x,
                         std::int64_t from, std::int64_t to) {
  const auto g = compile(schema);
  ASSERT_TRUE(g);
  for (const auto& [text, v] : decimals(from, to)) {
    const bool in = (lo_x ? v > lo : v >= lo) && (hi_x ? v < hi : v <= hi);
    EXPECT_EQ(matches(*g, text), in) << schema << " on " << text;
  }
}

TEST(json_schema, number_bounds_are_exact_decimals) {
  constexpr std::int64_t inf = INT64_MAX / 4;
  expect_number_range(R"({"type":"number","minimum":0.5,"maximum":1.5})", 500, false, 1500, false, -2000, 3000);
  expect_number_range(R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", 0, true, 1000, true, -1500, 2500);
  expect_number_range(R"({"type":"number","minimum":-2.25,"exclusiveMaximum":3.75})", -2250, false, 3750, true, -4000, 5000);
  expect_number_range(R"({"type":"number","minimum":0})", 0, false, inf, false, -3000, 3000);
  expect_number_range(R"({"type":"number","exclusiveMaximum":-1.5})", -inf, false, -1500, true, -4000, 2000);
  expect_number_range(R"({"type":"number","minimum":1.25,"maximum":1.75})", 1250, false, 1750, false, 0, 3000);
  expect_number_range(R"({"type":"number","minimum":-0.125,"maximum":0.125})", -125, false, 125, false, -1500, 1500);
  expect_number_range(R"({"type":"number","minimum":10,"exclusiveMinimum":true,"maximum":12})", 10000, true, 12000, false, 8000, 14000);
  const auto g = compile(R"({"type":"number","minimum":0,"maximum":100})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(*g, "99.99999999999999999"));
  EXPECT_TRUE(matches(*g, "100.0000"));
  EXPECT_FALSE(matches(*g, "100.00000000000001"));
  EXPECT_FALSE(matches(*g, "1e2"));  // bounded numbers are written without exponent
  expect_refused(R"({"type":"number","minimum":1,"exclusiveMaximum":1})", guide_error_code::unsupported, "");
}

TEST(json_schema, any_of_one_of_type_arrays_and_nullable) {
  expect_language(R"({"anyOf":[{"type":"string","maxLength":2},{"type":"integer","minimum":0}]})", {R"("ab")", "5"},
                  {R"("abc")", "-5", "null"});
  expect_language(R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"0"});
  expect_language(R"({"type":["string","null"],"maxLength":1})", {R"("a")", "null"}, {R"("ab")", "1"});
  expect_language(R"({"type":["integer","number"]})", {"1", "1.5"}, {"x"});
  expect_language(R"({"type":"integer","nullable":true})", {"1", "null"}, {"1.5"});
  expect_language(R"({"$ref":"#/$defs/s","nullable":true,"$defs":{"s":{"type":"string"}}})", {R"("a")", "null"}, {"1"});
  expect_language(R"({"type":"object","properties":{"a":{"type":"integer"}},"anyOf":[{"required":["a"]},{"properties":{"a":{"type":"integer"},"b":{"type":"null"}},"required":["b"]}]})",
                  {R"({"a":1})", R"({"b":null})", R"({"a":1,"b":null})"}, {"{}"});
}

TEST(json_schema, refs_defs_and_all_of) {
  constexpr auto schema = R"({"$defs":{"point":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]}},
      "definitions":{"label":{"type":"string","minLength":1}},
      "type":"object","properties":{"at":{"$ref":"#/$defs/point"},"name":{"$ref":"#/definitions/label"}},"required":["at","name"]})";
  expect_language(schema, {R"({"at":{"x":1,"y":2.5},"name":"p"})"}, {R"({"at":{"x":1},"name":"p"})", R"({"at":{"x":1,"y":2},"name":""})"});
  constexpr auto merged = R"({"$defs":{"base":{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}},
      "allOf":[{"$ref":"#/$defs/base"},{"properties":{"name":{"type":"string"}},"required":["name"]}]})";
  expect_language(merged, {R"({"id":1,"name":"a"})"}, {R"({"id":1})", R"({"name":"a"})", R"({"id":1,"name":"a","z":1})"});
  expect_language(R"({"allOf":[{"type":"string"},{"maxLength":2},{"minLength":1}]})", {R"("a")", R"("ab")"}, {R"("")", R"("abc")", "1"});
  expect_language(R"({"$ref":"#/$defs/n","$defs":{"n":{"type":"integer","maximum":3}},"minimum":1})", {"1", "3"}, {"0", "4"});
}

TEST(json_schema, recursive_refs_linked_list_and_tree) {
  constexpr auto list = R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
      "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["value","next"]}},"$ref":"#/$defs/node"})";
  expect_language(list, {R"({"value":1,"next":null})", R"({"value":1,"next":{"value":2,"next":{"value":3,"next":null}}})"},
                  {R"({"value":1})", R"({"value":1,"next":{"value":2}})", R"({"value":1,"next":{"value":"x","next":null}})"});
  constexpr auto tree = R"({"type":"object","properties":{"name":{"type":"string"},"children":{"type":"array","items":{"$ref":"#"}}},
      "required":["name"]})";
  expect_language(tree, {R"({"name":"a"})", R"({"name":"a","children":[{"name":"b","children":[]},{"name":"c","children":[{"name":"d"}]}]})"},
                  {R"({"name":"a","children":[{"children":[]}]})", R"({"name":"a","children":[1]})"});
  // A reference that reaches itself before consuming anything is refused, not a left-recursive rule.
  expect_refused(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"})",
                 guide_error_code::unsupported, "/$defs/a/anyOf/0/$ref");
}

TEST(json_schema, whitespace_between_tokens_is_bounded) {
  const auto g = compile(R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}},"required":["a"]})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(*g, R"({"a":[1,2]})"));
  EXPECT_TRUE(matches(*g, R"({ "a" : [ 1 , 2 ] } )"));
  EXPECT_TRUE(matches(*g, "{\n\t\"a\":\n" + std::string(20, ' ') + "[1]}\n"));
  EXPECT_FALSE(matches(*g, "{\n\"a\":\n" + std::string(21, ' ') + "[1]}"));
  EXPECT_FALSE(matches(*g, R"({"a":  [1]})"));
  EXPECT_FALSE(matches(*g, "{\"a\":\n\n[1]}"));
  EXPECT_FALSE(matches(*g, R"( {"a":[1]})"));  // nothing before the top-level value
  EXPECT_TRUE(viable_prefix(*g, "{\n" + std::string(20, ' ')));
  EXPECT_FALSE(viable_prefix(*g, "{\n" + std::string(21, ' ')));
}

TEST(json_schema, viable_prefixes_follow_the_schema) {
  const auto g = compile(R"({"type":"object","properties":{"n":{"type":"integer","minimum":10,"maximum":19}},"required":["n"]})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(viable_prefix(*g, R"({"n":1)"));
  EXPECT_FALSE(viable_prefix(*g, R"({"n":2)"));
  EXPECT_FALSE(viable_prefix(*g, R"({"m)"));
  EXPECT_FALSE(viable_prefix(*g, R"({"n":10,)"));
}

TEST(json_schema, json_object_is_any_object) {
  auto g = parse_gbnf(json_object_gbnf());
  ASSERT_TRUE(g.has_value()) << g.error().message();
  for (auto s : {"{}", R"({"a":1})", R"({"a":{"b":[1,2,{"c":null}]},"d":"e"})"}) EXPECT_TRUE(matches(*g, s)) << s;
  for (auto s : {"[]", "1", "\"x\"", "null", "{", R"({"a"})"}) EXPECT_FALSE(matches(*g, s)) << s;
}

TEST(json_schema, malformed_schemas_name_where) {
  expect_refused("{", guide_error_code::bad_schema, "");
  expect_refused("[1]", guide_error_code::bad_schema, "");
  expect_refused(R"({"type":"object","properties":{"age":{"type":"integer","minimum":"0"}}})", guide_error_code::bad_schema, "/properties/age/minimum");
  expect_refused(R"({"type":"strnig"})", guide_error_code::bad_schema, "/type");
  expect_refused(R"({"type":"object","properties":[]})", guide_error_code::bad_schema, "/properties");
  expect_refused(R"({"type":"object","required":"a"})", guide_error_code::bad_schema, "/required");
  expect_refused(R"({"type":"string","maxLength":-1})", guide_error_code::bad_schema, "/maxLength");
  expect_refused(R"({"type":"array","items":[1]})", guide_error_code::bad_schema, "/items/0");
  expect_refused(R"({"$ref":"#/$defs/missing"})", guide_error_code::bad_schema, "/$ref");
  expect_refused(R"({"properties":{"a/b":{"enum":3}}})", guide_error_code::bad_schema, "/properties/a~1b/enum");
  expect_refused(R"({"type":"string","pattern":"(ab"})", guide_error_code::bad_regex, "/pattern");
}

TEST(json_schema, unsupported_keywords_are_named) {
  expect_refused(R"({"not":{"type":"string"}})", guide_error_code::unsupported, "/not");
  expect_refused(R"({"if":{},"then":{}})", guide_error_code::unsupported, "/if");
  expect_refused(R"({"type":"object","patternProperties":{"^x":{}}})", guide_error_code::unsupported, "/patternProperties");
  expect_refused(R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})", guide_error_code::unsupported,
                 "/properties/a/uniqueItems");
  expect_refused(R"({"type":"integer","multipleOf":3})", guide_error_code::unsupported, "/multipleOf");
  expect_refused(R"({"type":"object","dependentRequired":{"a":["b"]}})", guide_error_code::unsupported, "/dependentRequired");
  expect_refused(R"({"$ref":"other.json#/a"})", guide_error_code::unsupported, "/$ref");
  expect_refused(R"({"type":"object","minProperties":1})", guide_error_code::unsupported, "/minProperties");
  expect_refused(R"({"allOf":[{"type":"string"},{"type":"integer"}]})", guide_error_code::unsupported, "/allOf/1/type");
  expect_refused(R"j({"type":"string","pattern":"(?=a)"})j", guide_error_code::unsupported, "/pattern");
  expect_refused(R"({"type":"string","pattern":"^a$","maxLength":3})", guide_error_code::unsupported, "/pattern");
  expect_refused("false", guide_error_code::unsupported, "");
  expect_refused(R"({"enum":[]})", guide_error_code::unsupported, "/enum");
  // Trivial ones are honoured: uniqueItems false, minProperties already implied by required.
  compile(R"({"type":"array","uniqueItems":false})");
  compile(R"({"type":"object","properties":{"a":{}},"required":["a"],"minProperties":1,"maxProperties":1})");
  compile(R"({"type":"object","unevaluatedProperties":true,"$comment":"x","title":"t","examples":[1]})");
}

TEST(json_schema, sizes_are_bounded) {
  expect_refused(R"({"type":"array","maxItems":20000})", guide_error_code::too_large, "/maxItems");
  expect_refused(R"({"type":"string","minLength":10001})", guide_error_code::too_large, "/minLength");
  std::string deep = R"({"type":"string"})";
  for (int i = 0; i < 70; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  EXPECT_EQ(refused(deep).code, guide_error_code::too_large);
  std::string deeper = "1";
  for (int i = 0; i < 100000; ++i) deeper = "[" + deeper;
  EXPECT_EQ(refused(deeper).code, guide_error_code::too_large);
  std::string wide = R"({"type":"object","properties":{)";
  for (int i = 0; i < 6000; ++i)
    wide += (i ? "," : "") + std::string("\"p") + std::to_string(i) + R"(":{"type":"integer","minimum":-123456789,"maximum":)" +
            std::to_string(987654321012LL + i) + "}";
  EXPECT_EQ(refused(wide + "}}").code, guide_error_code::too_large);
  // A schema at the bounds still compiles.
  std::string ok = R"({"type":"array","items":{"type":"integer"},"maxItems":10000})";
  EXPECT_TRUE(json_schema_to_gbnf(ok).has_value());
}

}  // namespace
}  // namespace troupe::guide

#pragma once
// JavaScript's string and number semantics over troupe's UTF-8 strings. The reference for chat
// templates (@huggingface/jinja) runs on JavaScript strings: lengths and indices count UTF-16 code
// units, trimming and splitting use JavaScript's whitespace class, numbers print as Number#toString
// does. Byte-exact parity needs those rules, so they live here, once.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::text::jinja::detail {

// Invalid UTF-8 sequences become U+FFFD, one per byte that starts no valid sequence.
std::string sanitize_utf8(std::string_view s);
// Decodes the code point at s[i] (s is valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view s, std::size_t& i);
void append_utf8(std::string& out, char32_t cp);

// JavaScript's \s: WhiteSpace and LineTerminator (tab, line feed, vertical tab, form feed, carriage
// return, space, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF).
bool is_js_space(char32_t cp);
// The byte length of the JavaScript whitespace character at s[i], 0 when there is none.
std::size_t js_space_at(std::string_view s, std::size_t i);
std::string_view js_trim(std::string_view s);
std::string_view js_trim_start(std::string_view s);
std::string_view js_trim_end(std::string_view s);

inline bool is_ascii_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
inline bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

// String#length: UTF-16 code units.
std::size_t utf16_length(std::string_view s);
// String#at(i): the UTF-16 code unit at i (negative counts from the end) as a string; a lone
// surrogate comes back as U+FFFD, as it would once JavaScript writes it out. nullopt when out of range.
std::optional<std::string> utf16_at(std::string_view s, std::int64_t i);
// Array.from(s): the code points, each as a view into s.
std::vector<std::string_view> code_points(std::string_view s);
// JavaScript's <, > and === on strings: UTF-16 code unit order. Negative, zero or positive.
int utf16_compare(std::string_view a, std::string_view b);

// Number#toString(): shortest round-trip digits, exponent form below 1e-6 and from 1e21.
std::string js_number(double v);
// How an integer value prints: exact up to 2^53, beyond that as JavaScript prints the double.
std::string js_integer(std::int64_t v);
// How a float value prints in a template: integral values keep one decimal ("2.0"), "-0.0" for -0.
std::string js_float(double v);
// parseInt(s, 10) and parseFloat(s); nullopt where JavaScript gives NaN.
std::optional<double> js_parse_int(std::string_view s);
std::optional<double> js_parse_float(std::string_view s);
// Number(s): the whole text (spaces around it aside) must be a number; "" is 0; NaN otherwise.
double js_to_number(std::string_view s);

// String#toUpperCase and String#toLowerCase (full case mapping, no final-sigma rule).
std::string js_upper(std::string_view s);
std::string js_lower(std::string_view s);
// The first UTF-16 code unit upper-cased, the rest unchanged (String#charAt(0).toUpperCase() + rest).
std::string js_capitalize(std::string_view s);
// s.replace(/\b\w/g, c => c.toUpperCase()): ASCII word starts upper-cased, nothing lower-cased.
std::string js_title(std::string_view s);

// JSON.stringify of a string; with ensure_ascii, every UTF-16 code unit from 0x7f up as \uXXXX.
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii);

}  // namespace troupe::text::jinja::detail

#pragma once
// The Unicode facts the tokenizer pipeline needs, in the forms Hugging Face's Rust code uses them:
// UTF-8 walking, Rust's from_utf8_lossy replacement rule, White_Space, "word" and "numeric" characters,
// and the normalization forms (through utf8proc). Private to the text layer.
#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::text::detail {

// The scalar starting at s[i] of a valid UTF-8 string; advances i past it.
char32_t next_scalar(std::string_view s, std::size_t& i);
// The scalar ending just before s[end] of a valid UTF-8 string; moves end back to its first byte.
char32_t prev_scalar(std::string_view s, std::size_t& end);
void append_utf8(std::string& out, char32_t c);
// Length of the UTF-8 sequence a lead byte announces (1 for bytes that cannot lead one).
std::size_t utf8_length(unsigned char lead);

bool is_ascii(std::string_view s);
// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s);

// How the bytes at the front of a buffer read as UTF-8: a complete scalar of `length` bytes, the start
// of one that more bytes could complete (incomplete), or `length` bytes that no continuation can make
// valid (the maximal ill-formed subpart, which Rust replaces by one U+FFFD).
enum class utf8_front { complete, incomplete, invalid };
utf8_front classify_front(std::string_view s, std::size_t& length);

// Rust's String::from_utf8_lossy: each maximal ill-formed subpart becomes U+FFFD.
std::string lossy_utf8(std::string_view bytes);

// Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s accept).
bool is_white_space(char32_t c);
// regex-syntax's word character: letters, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t c);
// Rust's char::is_numeric: general categories Nd, Nl, No.
bool is_numeric(char32_t c);
// The general categories Hugging Face's Rust code asks its Unicode crates for. Their tables are older
// Unicode than utf8proc's (characters assigned since are in no category there), so these four read
// tables taken from the pinned tokenizers (detail/unicode_categories.cpp), not utf8proc.
// Hugging Face's is_punc: ASCII punctuation or a P* category.
bool is_punctuation(char32_t c);
// Categories Mn, Mc or Me (what StripAccents drops).
bool is_combining_mark(char32_t c);
// Category Mn (what BertNormalizer's strip_accents drops after NFD).
bool is_nonspacing_mark(char32_t c);
// Categories Cc, Cf or Co (what BertNormalizer's clean_text drops, but tab, newline and return).
bool is_other(char32_t c);

enum class unicode_form { nfc, nfd, nfkc, nfkd };
std::string normalize(std::string_view s, unicode_form form);
// Rust's char::to_lowercase applied to every scalar (full mappings, no context).
std::string to_lower(std::string_view s);

// Rust's str::trim_start / trim_end: byte lengths of the leading / trailing White_Space.
std::size_t leading_white_space(std::string_view s);
std::size_t trailing_white_space(std::string_view s);

}  // namespace troupe::text::detail

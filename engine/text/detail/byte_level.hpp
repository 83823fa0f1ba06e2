#pragma once
// GPT-2's byte-level alphabet: every byte stands for one printable character (bytes that are printable
// Latin-1 for themselves, the rest for U+0100 onwards), so any byte string is a string of characters a
// vocabulary can hold. Private to the text layer.
#include <string>
#include <string_view>

namespace troupe::text::detail {

// The character byte b stands for, UTF-8 encoded (one or two bytes).
std::string_view byte_level_char(unsigned char b);
// Appends the byte-level form of `bytes`.
void byte_level_encode(std::string_view bytes, std::string& out);
// Appends the bytes a byte-level string stands for; false (appending nothing) when a character lies
// outside the alphabet.
bool byte_level_decode(std::string_view token, std::string& out);

}  // namespace troupe::text::detail

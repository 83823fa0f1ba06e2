#pragma once
// UTF-8 checks for names and keys read from checkpoint files, and a printable form of arbitrary bytes
// for error messages (a bad key must be named without putting bad bytes into the message).
#include <string>
#include <string_view>

namespace troupe::load::detail {

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s);

// `s` with every byte that is not part of a valid sequence, and every control byte, written as \xNN.
std::string printable(std::string_view s);

}  // namespace troupe::load::detail

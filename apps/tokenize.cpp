#include "apps/tokenize.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "engine/text/text_codec.hpp"

namespace troupe::app {

namespace {

std::string id_array(const std::vector<text::token_id>& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ']';
  return out;
}

}  // namespace

int run_tokenize(const tokenize_options& opt) {
  auto codec = text::text_codec::open(opt.tokenizer);
  if (!codec) {
    std::fprintf(stderr, "troupe tokenize: %s\n", codec.error().message().c_str());
    return 2;
  }
  const bool add_special = !opt.no_special;
  if (opt.jsonl.empty()) {
    auto ids = codec->encode(opt.text, add_special);
    if (!ids) {
      std::fprintf(stderr, "troupe tokenize: %s\n", ids.error().message().c_str());
      return 2;
    }
    std::puts(id_array(*ids).c_str());
    return 0;
  }
  std::ifstream in(opt.jsonl, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "troupe tokenize: %s: cannot open the file\n", opt.jsonl.c_str());
    return 2;
  }
  std::string line, out;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      std::fprintf(stderr, "troupe tokenize: %s:%zu: not JSON: %s\n", opt.jsonl.c_str(), number, e.what());
      return 2;
    }
    if (!j.is_string()) {
      std::fprintf(stderr, "troupe tokenize: %s:%zu: not a JSON string\n", opt.jsonl.c_str(), number);
      return 2;
    }
    auto ids = codec->encode(j.get_ref<const std::string&>(), add_special);
    if (!ids) {
      std::fprintf(stderr, "troupe tokenize: %s:%zu: %s\n", opt.jsonl.c_str(), number, ids.error().message().c_str());
      return 2;
    }
    out = id_array(*ids);
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

}  // namespace troupe::app

#include "engine/text/text_codec.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "engine/text/end_of_generation.hpp"
#include "engine/text/gguf_tokenizer.hpp"
#include "engine/text/tokenizer_json.hpp"

namespace troupe::text {

namespace {

using json = nlohmann::json;

// An optional JSON side file: nullopt when absent, an error when present but unreadable or malformed.
result<std::optional<json>, text_error> read_side_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<json>{};
  std::ifstream in(path, std::ios::binary);
  if (!in) return troupe::unexpected(text_error{text_error_code::io, path.string(), "", "cannot open the file"});
  std::ostringstream buf;
  buf << in.rdbuf();
  try {
    return std::optional<json>(json::parse(buf.str()));
  } catch (const json::exception& e) {
    return troupe::unexpected(
        text_error{text_error_code::bad_json, path.string(), "", std::string("not valid JSON: ") + e.what()});
  }
}

// tokenizer_config.json names a special token as a string or as {"content": ...}.
std::optional<std::string> token_name(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

// A string, or a list of {"name", "template"} from which "default" (or else the first) is taken.
std::string chat_template_of(const json& config) {
  const auto it = config.find("chat_template");
  if (it == config.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string first;
    for (const auto& e : *it) {
      if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
      const std::string t = e["template"].get<std::string>();
      if (first.empty()) first = t;
      if (e.contains("name") && e["name"] == "default") return t;
    }
    return first;
  }
  return {};
}

bool starts_with_gguf_magic(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

}  // namespace

text_codec::text_codec(tokenizer tok, special_ids ids, std::string chat_template)
    : tok_(std::move(tok)), ids_(std::move(ids)), chat_template_(std::move(chat_template)) {}

result<text_codec, text_error> text_codec::open(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return from_tokenizer_json(path / "tokenizer.json");
  if (path.extension() == ".gguf" || starts_with_gguf_magic(path)) {
    auto file = load::gguf_file::open(path);
    if (!file)
      return troupe::unexpected(text_error{file.error().code == load::load_error_code::io ? text_error_code::io
                                                                                            : text_error_code::bad_gguf,
                                           path.string(), file.error().item, file.error().reason});
    return from_gguf(*file);
  }
  return from_tokenizer_json(path);
}

result<text_codec, text_error> text_codec::from_tokenizer_json(const std::filesystem::path& tokenizer_json) {
  const auto dir = tokenizer_json.parent_path();
  auto config = read_side_file(dir / "tokenizer_config.json");
  if (!config) return troupe::unexpected(config.error());
  tokenizer_json_options options;
  if (*config && (*config)->is_object()) {
    const auto it = (*config)->find("split_special_tokens");
    if (it != (*config)->end() && it->is_boolean()) options.split_special_tokens = it->get<bool>();
  }
  auto tok = load_tokenizer_json(tokenizer_json, options);
  if (!tok) return troupe::unexpected(tok.error());

  special_ids ids;
  std::string chat_template;
  if (*config && (*config)->is_object()) {
    const json& c = **config;
    for (auto [key, slot] : {std::pair{"bos_token", &ids.bos}, std::pair{"eos_token", &ids.eos},
                             std::pair{"pad_token", &ids.pad}, std::pair{"unk_token", &ids.unk}})
      if (const auto name = token_name(c, key)) *slot = tok->token_to_id(*name);
    chat_template = chat_template_of(c);
  }
  if (!ids.unk)
    if (const auto unk = tok->parts().model.unk_token()) ids.unk = tok->token_to_id(*unk);
  // Without a config, the one token the post-processor puts first is the bos.
  if (!ids.bos)
    if (const auto prefix = tok->parts().post.prefix(); prefix.size() == 1) ids.bos = prefix.front();
  auto generation = read_side_file(dir / "generation_config.json");
  if (!generation) return troupe::unexpected(generation.error());
  if (*generation && (*generation)->is_object()) {
    const auto it = (*generation)->find("eos_token_id");
    if (it != (*generation)->end()) {
      if (it->is_number_integer()) ids.end_ids.push_back(it->get<token_id>());
      if (it->is_array())
        for (const auto& e : *it)
          if (e.is_number_integer()) ids.end_ids.push_back(e.get<token_id>());
    }
  }
  collect_end_ids(*tok, ids);
  return text_codec(std::move(*tok), std::move(ids), std::move(chat_template));
}

result<text_codec, text_error> text_codec::from_gguf(const load::gguf_file& file) {
  auto g = read_gguf_tokenizer(file);
  if (!g) return troupe::unexpected(g.error());
  return text_codec(std::move(g->tok), std::move(g->ids), std::move(g->chat_template));
}

result<std::vector<token_id>, text_error> text_codec::encode(std::string_view text, bool add_special) const {
  return tok_.encode(text, add_special);
}

std::string text_codec::decode(std::span<const token_id> ids, bool skip_special) const {
  return tok_.decode(ids, skip_special);
}

std::optional<std::string_view> text_codec::token_string(token_id id) const { return tok_.id_to_token(id); }
std::optional<token_id> text_codec::token_to_id(std::string_view token) const { return tok_.token_to_id(token); }
std::size_t text_codec::vocab_size() const { return tok_.vocab_size(); }
bool text_codec::is_special(token_id id) const { return tok_.is_special(id); }

}  // namespace troupe::text

#include "apps/chat_template_cmd.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>

#include "engine/load/gguf.hpp"
#include "engine/text/chat_template.hpp"

namespace troupe::app {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_text(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int fail(const std::string& message) {
  std::fprintf(stderr, "troupe chat-template: %s\n", message.c_str());
  return 2;
}

// "2024-07-26" or "2024-07-26T14:05".
std::optional<text::jinja::calendar_time> parse_date(const std::string& s) {
  text::jinja::calendar_time t;
  char sep = 0;
  int fields = std::sscanf(s.c_str(), "%d-%d-%d%c%d:%d", &t.year, &t.month, &t.day, &sep, &t.hour, &t.minute);
  if (fields != 3 && fields != 6) return std::nullopt;
  if (fields == 6 && sep != 'T' && sep != ' ') return std::nullopt;
  if (t.month < 1 || t.month > 12 || t.day < 1 || t.day > 31 || t.hour < 0 || t.hour > 23 || t.minute < 0 ||
      t.minute > 59)
    return std::nullopt;
  return t;
}

// The token text for a GGUF token id key (tokenizer.ggml.bos_token_id), from tokenizer.ggml.tokens.
std::optional<std::string> gguf_token(const load::gguf_file& g, const char* id_key) {
  const auto id = g.find_value(id_key);
  const auto tokens = g.find_value("tokenizer.ggml.tokens");
  if (!id || !tokens) return std::nullopt;
  const auto index = id->get().as_int();
  const auto* list = tokens->get().get_if<load::gguf_array>();
  if (!index || list == nullptr || list->type != load::gguf_type::string || *index < 0 ||
      static_cast<std::size_t>(*index) >= list->size())
    return std::nullopt;
  return std::string(list->string_at(static_cast<std::size_t>(*index)));
}

// A GGUF's template: tokenizer.chat_template, or a named one (tokenizer.chat_template.NAME) chosen as
// transformers chooses among named templates.
std::optional<std::string> gguf_template(const load::gguf_file& g, const std::string& name, bool has_tools,
                                         std::string& error) {
  auto text_of = [&](const std::string& key) -> std::optional<std::string> {
    const auto v = g.find_value(key);
    if (!v) return std::nullopt;
    const auto* s = v->get().get_if<std::string>();
    return s ? std::optional<std::string>(*s) : std::nullopt;
  };
  if (!name.empty() && name != "default") {
    auto t = text_of("tokenizer.chat_template." + name);
    if (!t) error = "the GGUF has no chat template named '" + name + "'";
    return t;
  }
  if (name.empty() && has_tools)
    if (auto t = text_of("tokenizer.chat_template.tool_use")) return t;
  auto t = text_of("tokenizer.chat_template");
  if (!t) error = "the GGUF has no tokenizer.chat_template";
  return t;
}

}  // namespace

int run_chat_template(const chat_template_options& opt) {
  text::chat_render_options render;
  render.add_generation_prompt = opt.add_generation_prompt;
  const auto messages = read_text(opt.messages);
  if (!messages) return fail("cannot read the messages file '" + opt.messages + "'");
  if (!opt.tools.empty()) {
    auto tools = read_text(opt.tools);
    if (!tools) return fail("cannot read the tools file '" + opt.tools + "'");
    render.tools_json = std::move(*tools);
  }
  render.extra_json = opt.kwargs;
  if (!opt.date.empty()) {
    render.date = parse_date(opt.date);
    if (!render.date) return fail("--date: '" + opt.date + "' is not YYYY-MM-DD or YYYY-MM-DDTHH:MM");
  }

  std::string source;
  const fs::path path(opt.model);
  if (path.extension() == ".gguf") {
    auto g = load::gguf_file::open(path);
    if (!g) return fail(g.error().message());
    std::string error;
    auto t = gguf_template(*g, opt.template_name, !render.tools_json.empty(), error);
    if (!t) return fail(opt.model + ": " + error);
    source = std::move(*t);
    render.bos_token = gguf_token(*g, "tokenizer.ggml.bos_token_id");
    render.eos_token = gguf_token(*g, "tokenizer.ggml.eos_token_id");
  } else {
    const fs::path config_path = fs::is_directory(path) ? path / "tokenizer_config.json" : path;
    const auto config = read_text(config_path.string());
    if (!config) return fail("cannot read '" + config_path.string() + "'");
    // A chat_template.jinja next to the config is what newer transformers versions save, and load first.
    const fs::path jinja_path = config_path.parent_path() / "chat_template.jinja";
    const bool separate = opt.template_name.empty() && fs::is_regular_file(jinja_path);
    auto found = text::chat_template_from_config(*config, !render.tools_json.empty(), opt.template_name);
    if (!found) return fail(config_path.string() + ": " + found.error().message);
    render.bos_token = found->bos_token;
    render.eos_token = found->eos_token;
    if (separate) {
      auto text = read_text(jinja_path.string());
      if (!text) return fail("cannot read '" + jinja_path.string() + "'");
      source = std::move(*text);
    } else {
      source = found->source;
    }
    if (source.empty()) return fail(config_path.string() + " has no chat_template");
  }

  auto tmpl = text::chat_template::parse(source);
  if (!tmpl) return fail("the chat template does not parse: " + tmpl.error().describe());
  auto prompt = tmpl->render(*messages, render);
  if (!prompt) return fail(prompt.error().describe());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  return 0;
}

}  // namespace troupe::app

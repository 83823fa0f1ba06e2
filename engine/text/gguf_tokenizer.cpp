#include "engine/text/gguf_tokenizer.hpp"

#include <algorithm>
#include <limits>
#include <span>

#include "engine/text/end_of_generation.hpp"

namespace troupe::text {

namespace {

constexpr std::string_view llama3_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr std::string_view qwen2_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr std::string_view gpt4o_pattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view deepseek3_patterns[] = {
    "\\p{N}{1,3}",
    "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+",  // 一-龥 ぀-ゟ ゠-ヿ
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+"
    "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};
// llama.cpp's fallback for a GGUF that names no pre-tokenizer.
constexpr std::string_view default_patterns[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};

// How a tokenizer.ggml.pre value is tokenized: the split regexes, whether whole words in the vocabulary
// skip the merges, whether text is first put in NFC. The regexes are the ones in the models'
// tokenizer.json (llama.cpp rewrites some for its own regex engine; PCRE2 reads the originals), and the
// flags follow tokenizer.json too, so a GGUF gives the ids the Hugging Face tokenizer gives.
struct pre_recipe {
  std::vector<std::string_view> patterns;
  bool ignore_merges = false;
  bool nfc = false;
};

std::optional<pre_recipe> recipe_for(std::string_view pre) {
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return pre_recipe{{llama3_pattern}, true, false};
  if (pre == "qwen2") return pre_recipe{{qwen2_pattern}, false, true};
  if (pre == "deepseek-v3") return pre_recipe{{std::begin(deepseek3_patterns), std::end(deepseek3_patterns)}, false, false};
  if (pre == "gpt-4o") return pre_recipe{{gpt4o_pattern}, true, false};
  if (pre == "gpt2") return pre_recipe{{gpt2_word_pattern}, false, false};
  if (pre == "default") return pre_recipe{{std::begin(default_patterns), std::end(default_patterns)}, false, false};
  return std::nullopt;
}

class gguf_reader {
 public:
  explicit gguf_reader(const load::gguf_file& f) : f_(f) {}

  text_error fail(text_error_code code, std::string key, std::string reason) const {
    return text_error{code, f_.name(), std::move(key), std::move(reason)};
  }

  const load::gguf_value* find(std::string_view key) const {
    const auto v = f_.find_value(key);
    return v ? &v->get() : nullptr;
  }

  result<std::optional<std::string>, text_error> string(std::string_view key) const {
    const auto* v = find(key);
    if (v == nullptr) return std::optional<std::string>{};
    const auto* s = v->get_if<std::string>();
    if (s == nullptr)
      return troupe::unexpected(fail(text_error_code::bad_gguf, std::string(key),
                                     "holds " + std::string(load::name(v->type())) + ", not a string"));
    return std::optional<std::string>(*s);
  }

  result<std::optional<bool>, text_error> boolean(std::string_view key) const {
    const auto* v = find(key);
    if (v == nullptr) return std::optional<bool>{};
    const auto* b = v->get_if<bool>();
    if (b == nullptr)
      return troupe::unexpected(fail(text_error_code::bad_gguf, std::string(key),
                                     "holds " + std::string(load::name(v->type())) + ", not a bool"));
    return std::optional<bool>(*b);
  }

  // An id key: absent, or an integer naming one of `count` tokens.
  result<std::optional<token_id>, text_error> id(std::string_view key, std::size_t count) const {
    const auto* v = find(key);
    if (v == nullptr) return std::optional<token_id>{};
    const auto i = v->as_int();
    if (!i)
      return troupe::unexpected(fail(text_error_code::bad_gguf, std::string(key),
                                     "holds " + std::string(load::name(v->type())) + ", not a token id"));
    // llama.cpp writes -1 (or u32 max) for "none".
    if (*i < 0 || *i == 0xFFFFFFFF) return std::optional<token_id>{};
    if (static_cast<std::uint64_t>(*i) >= count)
      return troupe::unexpected(fail(text_error_code::bad_value, std::string(key),
                                     "token id " + std::to_string(*i) + " is not below the " +
                                         std::to_string(count) + " tokens"));
    return std::optional<token_id>(static_cast<token_id>(*i));
  }

  result<const load::gguf_array*, text_error> array(std::string_view key, load::gguf_type element,
                                                    bool required) const {
    const auto* v = find(key);
    if (v == nullptr) {
      if (required) return troupe::unexpected(fail(text_error_code::missing_field, std::string(key), "is missing"));
      return static_cast<const load::gguf_array*>(nullptr);
    }
    const auto* a = v->get_if<load::gguf_array>();
    if (a == nullptr || a->type != element)
      return troupe::unexpected(fail(text_error_code::bad_gguf, std::string(key),
                                     "is not an array of " + std::string(load::name(element))));
    return a;
  }

 private:
  const load::gguf_file& f_;
};

}  // namespace

result<gguf_text, text_error> read_gguf_tokenizer(const load::gguf_file& file) {
  const gguf_reader g(file);
  auto model_name = g.string("tokenizer.ggml.model");
  if (!model_name) return troupe::unexpected(model_name.error());
  if (!*model_name)
    return troupe::unexpected(g.fail(text_error_code::missing_field, "tokenizer.ggml.model", "is missing"));
  const std::string kind = **model_name;
  if (kind != "gpt2" && kind != "llama" && kind != "bert")
    return troupe::unexpected(g.fail(text_error_code::unsupported, "tokenizer.ggml.model",
                                     "tokenizer model '" + kind + "' is not supported (gpt2, llama and bert are)"));

  auto tokens_array = g.array("tokenizer.ggml.tokens", load::gguf_type::string, true);
  if (!tokens_array) return troupe::unexpected(tokens_array.error());
  std::vector<std::string> tokens;
  tokens.reserve((*tokens_array)->size());
  for (std::size_t i = 0; i < (*tokens_array)->size(); ++i) tokens.emplace_back((*tokens_array)->string_at(i));
  const std::size_t n = tokens.size();
  if (n == 0) return troupe::unexpected(g.fail(text_error_code::bad_value, "tokenizer.ggml.tokens", "is empty"));

  std::vector<gguf_token_type> types(n, gguf_token_type::normal);
  auto types_array = g.array("tokenizer.ggml.token_type", load::gguf_type::i32, false);
  if (!types_array) return troupe::unexpected(types_array.error());
  if (*types_array != nullptr) {
    if ((*types_array)->size() != n)
      return troupe::unexpected(g.fail(text_error_code::bad_value, "tokenizer.ggml.token_type",
                                       "holds " + std::to_string((*types_array)->size()) + " types for " +
                                           std::to_string(n) + " tokens"));
    for (std::size_t i = 0; i < n; ++i) types[i] = static_cast<gguf_token_type>((*types_array)->scalar_at<std::int32_t>(i));
  }

  special_ids ids;
  for (auto [key, slot] : {std::pair{"tokenizer.ggml.bos_token_id", &ids.bos}, std::pair{"tokenizer.ggml.eos_token_id", &ids.eos},
                           std::pair{"tokenizer.ggml.unknown_token_id", &ids.unk},
                           std::pair{"tokenizer.ggml.padding_token_id", &ids.pad}}) {
    auto id = g.id(key, n);
    if (!id) return troupe::unexpected(id.error());
    *slot = *id;
  }
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    auto id = g.id(key, n);
    if (!id) return troupe::unexpected(id.error());
    if (*id) ids.end_ids.push_back(**id);
  }

  const bool spm = kind == "llama", wpm = kind == "bert";
  auto add_bos = g.boolean("tokenizer.ggml.add_bos_token");
  if (!add_bos) return troupe::unexpected(add_bos.error());
  auto add_eos = g.boolean("tokenizer.ggml.add_eos_token");
  if (!add_eos) return troupe::unexpected(add_eos.error());
  auto space_prefix = g.boolean("tokenizer.ggml.add_space_prefix");
  if (!space_prefix) return troupe::unexpected(space_prefix.error());

  bpe_options options;
  const bpe_source source{file.name(), "tokenizer.ggml.tokens", spm ? "tokenizer.ggml.scores" : "tokenizer.ggml.merges"};
  std::optional<token_model> model;
  normalizer norm;
  pre_tokenizer pre;
  decoder dec;
  if (wpm) {
    // llama.cpp's WPM vocabulary is WordPiece's with a phantom space: its converter keeps control
    // tokens ([CLS]) as they are, writes a continuation "##x" as "x" and a word start "x" as "\u2581x".
    // Undone here, the text runs through the same WordPiece pipeline as tokenizer.json's BERT: the
    // BertNormalizer (lowercase and strip_accents as tokenizer.ggml.normalizer.* say, both on by
    // default, as llama.cpp reads them), a White_Space and punctuation split, the greedy longest match
    // in which a word with an uncovered stretch is one [UNK] (llama.cpp sets no word length limit).
    std::vector<std::pair<std::string, token_id>> vocab;
    vocab.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string& t = tokens[i];
      std::string piece;
      if (types[i] == gguf_token_type::control) piece = t;
      else if (t.starts_with("\xE2\x96\x81")) piece = t.substr(3);
      else piece = "##" + t;
      vocab.emplace_back(std::move(piece), static_cast<token_id>(i));
    }
    if (!ids.unk && n > 100) ids.unk = 100;  // llama.cpp's defaults for a WPM vocabulary
    if (!ids.unk)
      return troupe::unexpected(g.fail(text_error_code::missing_field, "tokenizer.ggml.unknown_token_id", "is missing (WordPiece needs it)"));
    wordpiece_options wo;
    wo.unk_token = vocab[static_cast<std::size_t>(*ids.unk)].first;
    wo.max_input_chars_per_word = std::numeric_limits<std::size_t>::max();
    auto m = wordpiece_model::from_vocab(std::move(vocab), wo, wordpiece_source{file.name(), "tokenizer.ggml.tokens"});
    if (!m) return troupe::unexpected(m.error());
    model = token_model(std::move(*m));
    auto lower = g.boolean("tokenizer.ggml.normalizer.lowercase");
    if (!lower) return troupe::unexpected(lower.error());
    auto strip = g.boolean("tokenizer.ggml.normalizer.strip_accents");
    if (!strip) return troupe::unexpected(strip.error());
    bert_normalizer bn;
    bn.lowercase = lower->value_or(true);
    bn.strip_accents = strip->value_or(bn.lowercase);
    norm.add(bn);
    pre.add(whitespace_split_pre_tokenizer{});
    pre.add(punctuation_pre_tokenizer{split_behavior::isolated});
    dec.add(wordpiece_decoder{"##", true});
  } else if (spm) {
    auto scores_array = g.array("tokenizer.ggml.scores", load::gguf_type::f32, true);
    if (!scores_array) return troupe::unexpected(scores_array.error());
    std::vector<float> scores;
    scores.reserve(n);
    for (std::size_t i = 0; i < (*scores_array)->size(); ++i) scores.push_back((*scores_array)->scalar_at<float>(i));
    std::vector<bool> mergeable(n);
    for (std::size_t i = 0; i < n; ++i)
      mergeable[i] = types[i] == gguf_token_type::normal || types[i] == gguf_token_type::user_defined ||
                     types[i] == gguf_token_type::undefined;
    options.byte_fallback = true;
    options.fuse_unk = true;
    if (ids.unk) options.unk_token = tokens[static_cast<std::size_t>(*ids.unk)];
    auto m = bpe_model::from_scores(tokens, scores, mergeable, options, source);
    if (!m) return troupe::unexpected(m.error());
    model = token_model(std::move(*m));
    const bool prefix = space_prefix->value_or(true);
    if (prefix) norm.add(prepend_normalizer{"\xE2\x96\x81"});
    norm.add(replace_normalizer{text_pattern::literal(" "), "\xE2\x96\x81"});
    dec.add(replace_decoder{text_pattern::literal("\xE2\x96\x81"), " "});
    dec.add(byte_fallback_decoder{});
    dec.add(fuse_decoder{});
    if (prefix) dec.add(strip_decoder{" ", 1, 0});
  } else {
    auto pre_name = g.string("tokenizer.ggml.pre");
    if (!pre_name) return troupe::unexpected(pre_name.error());
    const std::string pre_value = pre_name->value_or("default");
    const auto recipe = recipe_for(pre_value);
    if (!recipe)
      return troupe::unexpected(g.fail(text_error_code::unsupported, "tokenizer.ggml.pre",
                                       "pre-tokenizer '" + pre_value +
                                           "' is not supported (llama-bpe, qwen2, deepseek-v3, gpt-4o, gpt2, default are)"));
    auto merges_array = g.array("tokenizer.ggml.merges", load::gguf_type::string, true);
    if (!merges_array) return troupe::unexpected(merges_array.error());
    std::vector<bpe_merge> merges;
    merges.reserve((*merges_array)->size());
    for (std::size_t i = 0; i < (*merges_array)->size(); ++i) {
      const std::string_view line = (*merges_array)->string_at(i);
      const auto space = line.find(' ', 1);  // a merge's left side may itself begin with a space
      if (space == std::string_view::npos)
        return troupe::unexpected(g.fail(text_error_code::bad_value, "tokenizer.ggml.merges[" + std::to_string(i) + "]",
                                         "'" + std::string(line) + "' is not two tokens separated by a space"));
      merges.push_back({std::string(line.substr(0, space)), std::string(line.substr(space + 1))});
    }
    options.ignore_merges = recipe->ignore_merges;
    std::vector<std::pair<std::string, token_id>> vocab;
    vocab.reserve(n);
    for (std::size_t i = 0; i < n; ++i) vocab.emplace_back(tokens[i], static_cast<token_id>(i));
    auto m = bpe_model::from_merges(std::move(vocab), merges, options, source);
    if (!m) return troupe::unexpected(m.error());
    model = token_model(std::move(*m));
    if (recipe->nfc) norm.add(unicode_normalizer{normalization_form::nfc});
    for (const auto p : recipe->patterns) {
      auto re = text_pattern::regex(p);
      if (!re)
        return troupe::unexpected(g.fail(text_error_code::bad_regex, "tokenizer.ggml.pre", "PCRE2 refuses: " + re.error()));
      pre.add(split_pre_tokenizer{std::move(*re), split_behavior::isolated, false});
    }
    pre.add(byte_level_pre_tokenizer{false, false});
    dec.add(byte_level_decoder{});
  }

  std::vector<added_token> added;
  std::vector<std::string> patterns;
  for (std::size_t i = 0; i < n; ++i) {
    const auto t = types[i];
    if (t != gguf_token_type::control && t != gguf_token_type::user_defined && t != gguf_token_type::unknown) continue;
    if (tokens[i].empty()) continue;
    added.push_back({static_cast<token_id>(i), tokens[i], false, false, false, false, t != gguf_token_type::user_defined});
    patterns.push_back(tokens[i]);
  }
  added_vocabulary av;
  av.set_tokens(std::move(added), patterns);

  post_processor post;
  if (wpm) {
    // [CLS] text [SEP], as llama.cpp's WPM adds them: its bos (101 unless named) and its separator.
    auto cls = g.id("tokenizer.ggml.cls_token_id", n);
    if (!cls) return troupe::unexpected(cls.error());
    auto sep = g.id("tokenizer.ggml.seperator_token_id", n);  // llama.cpp's spelling
    if (!sep) return troupe::unexpected(sep.error());
    auto add_sep = g.boolean("tokenizer.ggml.add_sep_token");
    if (!add_sep) return troupe::unexpected(add_sep.error());
    if (!ids.bos) ids.bos = *cls ? *cls : (n > 101 ? std::optional<token_id>(101) : std::nullopt);
    if (!*sep && n > 102) *sep = 102;
    const bool b = add_bos->value_or(true) && ids.bos, s = add_sep->value_or(true) && *sep;
    if (b || s) {
      token_template t;
      if (b) t.push_back({false, {*ids.bos}});
      t.push_back({true, {}});
      if (s) t.push_back({false, {**sep}});
      post.add(std::move(t));
    }
  }
  const bool bos = !wpm && add_bos->value_or(spm) && ids.bos;
  const bool eos = !wpm && add_eos->value_or(false) && ids.eos;
  if (bos || eos) {
    token_template t;
    if (bos) t.push_back({false, {*ids.bos}});
    t.push_back({true, {}});
    if (eos) t.push_back({false, {*ids.eos}});
    post.add(std::move(t));
  }

  auto chat = g.string("tokenizer.chat_template");
  if (!chat) return troupe::unexpected(chat.error());

  tokenizer tok(tokenizer_parts{std::move(*model), std::move(norm), std::move(pre), std::move(av), std::move(post),
                                std::move(dec)});
  collect_end_ids(tok, ids);
  return gguf_text{std::move(tok), std::move(ids), chat->value_or("")};
}

}  // namespace troupe::text

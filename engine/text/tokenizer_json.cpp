#include "engine/text/tokenizer_json.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <sstream>

namespace troupe::text {

namespace {

using json = nlohmann::json;

// Where the reader is: the file, for every error it makes.
struct reader {
  std::string file;

  text_error fail(text_error_code code, std::string field, std::string reason) const {
    return text_error{code, file, std::move(field), std::move(reason)};
  }
};

std::string_view kind(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "a value of another kind";
  }
}

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}
std::string index(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

// A member of an object, or null when absent.
const json& member(const json& obj, std::string_view key) {
  static const json null_value;
  if (!obj.is_object()) return null_value;
  const auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}

result<bool, text_error> get_bool(const reader& r, const json& obj, std::string_view key, const std::string& path,
                                  bool fallback) {
  const json& v = member(obj, key);
  if (v.is_null()) return fallback;
  if (!v.is_boolean())
    return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, key),
                                     "is " + std::string(kind(v)) + ", not a boolean"));
  return v.get<bool>();
}

result<std::optional<std::string>, text_error> get_string(const reader& r, const json& obj, std::string_view key,
                                                          const std::string& path) {
  const json& v = member(obj, key);
  if (v.is_null()) return std::optional<std::string>{};
  if (!v.is_string())
    return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, key),
                                     "is " + std::string(kind(v)) + ", not a string"));
  return std::optional<std::string>(v.get<std::string>());
}

result<std::string, text_error> require_string(const reader& r, const json& obj, std::string_view key,
                                               const std::string& path) {
  auto s = get_string(r, obj, key, path);
  if (!s) return troupe::unexpected(s.error());
  if (!*s) return troupe::unexpected(r.fail(text_error_code::missing_field, join(path, key), "is missing"));
  return std::move(**s);
}

result<std::int64_t, text_error> get_int(const reader& r, const json& obj, std::string_view key,
                                         const std::string& path, std::optional<std::int64_t> fallback) {
  const json& v = member(obj, key);
  if (v.is_null()) {
    if (fallback) return *fallback;
    return troupe::unexpected(r.fail(text_error_code::missing_field, join(path, key), "is missing"));
  }
  if (!v.is_number_integer())
    return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, key),
                                     "is " + std::string(kind(v)) + ", not an integer"));
  return v.get<std::int64_t>();
}

result<token_id, text_error> to_token_id(const reader& r, const json& v, const std::string& path) {
  if (!v.is_number_integer())
    return troupe::unexpected(
        r.fail(text_error_code::bad_json, path, "is " + std::string(kind(v)) + ", not a token id"));
  const auto id = v.get<std::int64_t>();
  if (id < 0 || id > INT32_MAX)
    return troupe::unexpected(
        r.fail(text_error_code::bad_value, path, "token id " + std::to_string(id) + " is out of range"));
  return static_cast<token_id>(id);
}

result<text_pattern, text_error> read_pattern(const reader& r, const json& obj, const std::string& path) {
  const json& p = member(obj, "pattern");
  const std::string field = join(path, "pattern");
  if (!p.is_object())
    return troupe::unexpected(r.fail(p.is_null() ? text_error_code::missing_field : text_error_code::bad_json, field,
                                     "must be {\"String\": ...} or {\"Regex\": ...}"));
  if (const json& s = member(p, "String"); s.is_string()) return text_pattern::literal(s.get<std::string>());
  if (const json& s = member(p, "Regex"); s.is_string()) {
    auto re = text_pattern::regex(s.get<std::string>());
    if (!re)
      return troupe::unexpected(r.fail(text_error_code::bad_regex, join(field, "Regex"),
                                       "PCRE2 refuses the pattern: " + re.error()));
    return std::move(*re);
  }
  return troupe::unexpected(
      r.fail(text_error_code::bad_json, field, "must be {\"String\": ...} or {\"Regex\": ...}"));
}

result<std::string, text_error> component_type(const reader& r, const json& j, const std::string& path) {
  if (!j.is_object())
    return troupe::unexpected(r.fail(text_error_code::bad_json, path, "is " + std::string(kind(j)) + ", not an object"));
  auto t = require_string(r, j, "type", path);
  if (!t) return troupe::unexpected(t.error());
  return std::move(*t);
}

text_error unsupported(const reader& r, const std::string& path, std::string_view what, const std::string& type) {
  return r.fail(text_error_code::unsupported, join(path, "type"),
                std::string(what) + " type '" + type + "' is not supported");
}

// Adds a step that has no parameters to read.
template <class Steps, class Step>
result<void, text_error> add_step(Steps& out, Step step) {
  out.add(std::move(step));
  return {};
}

result<split_behavior, text_error> read_behavior(const reader& r, const json& obj, const std::string& path,
                                                 split_behavior fallback) {
  auto s = get_string(r, obj, "behavior", path);
  if (!s) return troupe::unexpected(s.error());
  if (!*s) return fallback;
  const std::string& b = **s;
  if (b == "Removed") return split_behavior::removed;
  if (b == "Isolated") return split_behavior::isolated;
  if (b == "MergedWithPrevious") return split_behavior::merged_with_previous;
  if (b == "MergedWithNext") return split_behavior::merged_with_next;
  if (b == "Contiguous") return split_behavior::contiguous;
  return troupe::unexpected(r.fail(text_error_code::bad_value, join(path, "behavior"),
                                   "unknown split behavior '" + b + "'"));
}

result<prepend_scheme, text_error> read_prepend_scheme(const reader& r, const json& obj, const std::string& path) {
  auto s = get_string(r, obj, "prepend_scheme", path);
  if (!s) return troupe::unexpected(s.error());
  if (!*s) {
    // Files written before prepend_scheme existed say add_prefix_space instead.
    auto add = get_bool(r, obj, "add_prefix_space", path, true);
    if (!add) return troupe::unexpected(add.error());
    return *add ? prepend_scheme::always : prepend_scheme::never;
  }
  if (**s == "always") return prepend_scheme::always;
  if (**s == "first") return prepend_scheme::first;
  if (**s == "never") return prepend_scheme::never;
  return troupe::unexpected(r.fail(text_error_code::bad_value, join(path, "prepend_scheme"),
                                   "unknown prepend scheme '" + **s + "'"));
}

result<std::string, text_error> read_replacement(const reader& r, const json& obj, const std::string& path) {
  auto s = get_string(r, obj, "replacement", path);
  if (!s) return troupe::unexpected(s.error());
  return s->value_or("\xE2\x96\x81");
}

result<void, text_error> read_normalizer(const reader& r, const json& j, const std::string& path, normalizer& out) {
  if (j.is_null()) return {};
  auto type = component_type(r, j, path);
  if (!type) return troupe::unexpected(type.error());
  const std::string& t = *type;
  if (t == "Sequence") {
    const json& list = member(j, "normalizers");
    if (!list.is_array())
      return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, "normalizers"), "must be an array"));
    for (std::size_t i = 0; i < list.size(); ++i)
      if (auto ok = read_normalizer(r, list[i], index(join(path, "normalizers"), i), out); !ok) return ok;
    return {};
  }
  if (t == "NFC") return add_step(out, unicode_normalizer{normalization_form::nfc});
  if (t == "NFD") return add_step(out, unicode_normalizer{normalization_form::nfd});
  if (t == "NFKC") return add_step(out, unicode_normalizer{normalization_form::nfkc});
  if (t == "NFKD") return add_step(out, unicode_normalizer{normalization_form::nfkd});
  if (t == "Lowercase") return add_step(out, lowercase_normalizer{});
  if (t == "StripAccents") return add_step(out, strip_accents_normalizer{});
  if (t == "BertNormalizer") {
    bert_normalizer n;
    for (auto [key, flag] : {std::pair{"clean_text", &n.clean_text},
                             std::pair{"handle_chinese_chars", &n.handle_chinese_chars},
                             std::pair{"lowercase", &n.lowercase}}) {
      auto b = get_bool(r, j, key, path, *flag);
      if (!b) return troupe::unexpected(b.error());
      *flag = *b;
    }
    if (!member(j, "strip_accents").is_null()) {
      auto strip = get_bool(r, j, "strip_accents", path, false);
      if (!strip) return troupe::unexpected(strip.error());
      n.strip_accents = *strip;
    }
    out.add(n);
    return {};
  }
  if (t == "Replace") {
    auto pattern = read_pattern(r, j, path);
    if (!pattern) return troupe::unexpected(pattern.error());
    auto content = require_string(r, j, "content", path);
    if (!content) return troupe::unexpected(content.error());
    out.add(replace_normalizer{std::move(*pattern), std::move(*content)});
    return {};
  }
  if (t == "Prepend") {
    auto prefix = require_string(r, j, "prepend", path);
    if (!prefix) return troupe::unexpected(prefix.error());
    out.add(prepend_normalizer{std::move(*prefix)});
    return {};
  }
  if (t == "Strip") {
    auto left = get_bool(r, j, "strip_left", path, true);
    if (!left) return troupe::unexpected(left.error());
    auto right = get_bool(r, j, "strip_right", path, true);
    if (!right) return troupe::unexpected(right.error());
    out.add(strip_normalizer{*left, *right});
    return {};
  }
  return troupe::unexpected(unsupported(r, path, "normalizer", t));
}

result<void, text_error> read_pre_tokenizer(const reader& r, const json& j, const std::string& path,
                                            pre_tokenizer& out) {
  if (j.is_null()) return {};
  auto type = component_type(r, j, path);
  if (!type) return troupe::unexpected(type.error());
  const std::string& t = *type;
  if (t == "Sequence") {
    const json& list = member(j, "pretokenizers");
    if (!list.is_array())
      return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, "pretokenizers"), "must be an array"));
    for (std::size_t i = 0; i < list.size(); ++i)
      if (auto ok = read_pre_tokenizer(r, list[i], index(join(path, "pretokenizers"), i), out); !ok) return ok;
    return {};
  }
  if (t == "Split") {
    auto pattern = read_pattern(r, j, path);
    if (!pattern) return troupe::unexpected(pattern.error());
    auto behavior = read_behavior(r, j, path, split_behavior::isolated);
    if (!behavior) return troupe::unexpected(behavior.error());
    auto invert = get_bool(r, j, "invert", path, false);
    if (!invert) return troupe::unexpected(invert.error());
    out.add(split_pre_tokenizer{std::move(*pattern), *behavior, *invert});
    return {};
  }
  if (t == "ByteLevel") {
    auto prefix = get_bool(r, j, "add_prefix_space", path, true);
    if (!prefix) return troupe::unexpected(prefix.error());
    auto regex = get_bool(r, j, "use_regex", path, true);
    if (!regex) return troupe::unexpected(regex.error());
    out.add(byte_level_pre_tokenizer{*prefix, *regex});
    return {};
  }
  if (t == "Metaspace") {
    auto replacement = read_replacement(r, j, path);
    if (!replacement) return troupe::unexpected(replacement.error());
    auto scheme = read_prepend_scheme(r, j, path);
    if (!scheme) return troupe::unexpected(scheme.error());
    auto split = get_bool(r, j, "split", path, true);
    if (!split) return troupe::unexpected(split.error());
    out.add(metaspace_pre_tokenizer{std::move(*replacement), *scheme, *split});
    return {};
  }
  if (t == "Digits") {
    auto individual = get_bool(r, j, "individual_digits", path, false);
    if (!individual) return troupe::unexpected(individual.error());
    out.add(digits_pre_tokenizer{*individual});
    return {};
  }
  if (t == "Punctuation") {
    auto behavior = read_behavior(r, j, path, split_behavior::isolated);
    if (!behavior) return troupe::unexpected(behavior.error());
    out.add(punctuation_pre_tokenizer{*behavior});
    return {};
  }
  if (t == "Whitespace") return add_step(out, whitespace_pre_tokenizer{});
  if (t == "WhitespaceSplit") return add_step(out, whitespace_split_pre_tokenizer{});
  if (t == "BertPreTokenizer") {
    // What Hugging Face's BertPreTokenizer is: a White_Space split, then each punctuation character alone.
    out.add(whitespace_split_pre_tokenizer{});
    out.add(punctuation_pre_tokenizer{split_behavior::isolated});
    return {};
  }
  return troupe::unexpected(unsupported(r, path, "pre-tokenizer", t));
}

result<void, text_error> read_decoder(const reader& r, const json& j, const std::string& path, decoder& out) {
  if (j.is_null()) return {};
  auto type = component_type(r, j, path);
  if (!type) return troupe::unexpected(type.error());
  const std::string& t = *type;
  if (t == "Sequence") {
    const json& list = member(j, "decoders");
    if (!list.is_array())
      return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, "decoders"), "must be an array"));
    for (std::size_t i = 0; i < list.size(); ++i)
      if (auto ok = read_decoder(r, list[i], index(join(path, "decoders"), i), out); !ok) return ok;
    return {};
  }
  if (t == "ByteLevel") return add_step(out, byte_level_decoder{});
  if (t == "ByteFallback") return add_step(out, byte_fallback_decoder{});
  if (t == "Fuse") return add_step(out, fuse_decoder{});
  if (t == "WordPiece") {
    auto prefix = get_string(r, j, "prefix", path);
    if (!prefix) return troupe::unexpected(prefix.error());
    auto cleanup = get_bool(r, j, "cleanup", path, true);
    if (!cleanup) return troupe::unexpected(cleanup.error());
    out.add(wordpiece_decoder{prefix->value_or("##"), *cleanup});
    return {};
  }
  if (t == "Metaspace") {
    auto replacement = read_replacement(r, j, path);
    if (!replacement) return troupe::unexpected(replacement.error());
    auto scheme = read_prepend_scheme(r, j, path);
    if (!scheme) return troupe::unexpected(scheme.error());
    out.add(metaspace_decoder{std::move(*replacement), *scheme});
    return {};
  }
  if (t == "Strip") {
    auto content = get_string(r, j, "content", path);
    if (!content) return troupe::unexpected(content.error());
    auto start = get_int(r, j, "start", path, 0);
    if (!start) return troupe::unexpected(start.error());
    auto stop = get_int(r, j, "stop", path, 0);
    if (!stop) return troupe::unexpected(stop.error());
    if (*start < 0 || *stop < 0)
      return troupe::unexpected(r.fail(text_error_code::bad_value, path, "start and stop must not be negative"));
    out.add(strip_decoder{content->value_or(" "), static_cast<std::size_t>(*start), static_cast<std::size_t>(*stop)});
    return {};
  }
  if (t == "Replace") {
    auto pattern = read_pattern(r, j, path);
    if (!pattern) return troupe::unexpected(pattern.error());
    auto content = require_string(r, j, "content", path);
    if (!content) return troupe::unexpected(content.error());
    out.add(replace_decoder{std::move(*pattern), std::move(*content)});
    return {};
  }
  return troupe::unexpected(unsupported(r, path, "decoder", t));
}

// The [token, id] pairs RobertaProcessing and BertProcessing name their cls and sep tokens with.
result<token_id, text_error> read_token_pair(const reader& r, const json& obj, std::string_view key,
                                             const std::string& path) {
  const json& v = member(obj, key);
  const std::string field = join(path, key);
  if (!v.is_array() || v.size() != 2 || !v[0].is_string())
    return troupe::unexpected(r.fail(text_error_code::bad_json, field, "must be [token, id]"));
  return to_token_id(r, v[1], index(field, 1));
}

result<void, text_error> read_post_processor(const reader& r, const json& j, const std::string& path,
                                             post_processor& out) {
  if (j.is_null()) return {};
  auto type = component_type(r, j, path);
  if (!type) return troupe::unexpected(type.error());
  const std::string& t = *type;
  if (t == "Sequence") {
    const json& list = member(j, "processors");
    if (!list.is_array())
      return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, "processors"), "must be an array"));
    for (std::size_t i = 0; i < list.size(); ++i)
      if (auto ok = read_post_processor(r, list[i], index(join(path, "processors"), i), out); !ok) return ok;
    return {};
  }
  if (t == "ByteLevel") return {};  // offsets only
  if (t == "RobertaProcessing" || t == "BertProcessing") {
    auto cls = read_token_pair(r, j, "cls", path);
    if (!cls) return troupe::unexpected(cls.error());
    auto sep = read_token_pair(r, j, "sep", path);
    if (!sep) return troupe::unexpected(sep.error());
    out.add({template_piece{false, {*cls}}, template_piece{true, {}}, template_piece{false, {*sep}}});
    return {};
  }
  if (t == "TemplateProcessing") {
    const json& single = member(j, "single");
    const std::string single_path = join(path, "single");
    if (!single.is_array())
      return troupe::unexpected(r.fail(text_error_code::bad_json, single_path, "must be an array"));
    const json& specials = member(j, "special_tokens");
    token_template tmpl;
    for (std::size_t i = 0; i < single.size(); ++i) {
      const json& piece = single[i];
      const std::string piece_path = index(single_path, i);
      if (const json& seq = member(piece, "Sequence"); seq.is_object()) {
        tmpl.push_back({true, {}});
        continue;
      }
      const json& sp = member(piece, "SpecialToken");
      if (!sp.is_object())
        return troupe::unexpected(
            r.fail(text_error_code::bad_json, piece_path, "must hold a Sequence or a SpecialToken"));
      auto name = require_string(r, sp, "id", join(piece_path, "SpecialToken"));
      if (!name) return troupe::unexpected(name.error());
      const json& entry = member(specials, *name);
      if (!entry.is_object())
        return troupe::unexpected(r.fail(text_error_code::unknown_token, piece_path,
                                         "special token '" + *name + "' is not in special_tokens"));
      const json& ids = member(entry, "ids");
      const std::string ids_path = join(join(join(path, "special_tokens"), *name), "ids");
      if (!ids.is_array())
        return troupe::unexpected(r.fail(text_error_code::bad_json, ids_path, "must be an array of ids"));
      template_piece fixed;
      for (std::size_t k = 0; k < ids.size(); ++k) {
        auto id = to_token_id(r, ids[k], index(ids_path, k));
        if (!id) return troupe::unexpected(id.error());
        fixed.ids.push_back(*id);
      }
      tmpl.push_back(std::move(fixed));
    }
    out.add(std::move(tmpl));
    return {};
  }
  return troupe::unexpected(unsupported(r, path, "post-processor", t));
}

// The vocab and merges of a BPE model are most of a tokenizer.json (hundreds of thousands of entries);
// building them as JSON values first would take most of the load time. This SAX handler builds the
// document as usual except for model.vocab (an object) and model.merges (an array), which it reads
// straight into the lists the model is made from; their entries are checked as they arrive.
class tokenizer_sax {
 public:
  explicit tokenizer_sax(json& root) : dom_(root, false) {}

  std::optional<std::vector<std::pair<std::string, token_id>>> vocab;
  std::optional<std::vector<bpe_merge>> merges;
  std::optional<text_error> error;  // the file is left empty; the caller fills it in
  std::string syntax_error;

  bool null() { return capturing() ? bad_entry("null") : dom_.null(); }
  bool boolean(bool v) { return capturing() ? bad_entry("a boolean") : dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) {
    if (mode_ == mode::vocab) {
      if (v < 0)
        return fail(text_error_code::bad_value, vocab_field(), "token id " + std::to_string(v) + " is out of range");
      return add_vocab(static_cast<std::uint64_t>(v));
    }
    return capturing() ? bad_entry("an integer") : dom_.number_integer(v);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == mode::vocab) return add_vocab(v);
    return capturing() ? bad_entry("an integer") : dom_.number_unsigned(v);
  }
  bool number_float(json::number_float_t v, const std::string& s) {
    return capturing() ? bad_entry("a number") : dom_.number_float(v, s);
  }
  bool string(std::string& v) {
    if (mode_ == mode::vocab) return bad_entry("a string");
    if (mode_ == mode::merges) {
      if (in_pair_) {
        if (pair_.size() >= 2) return bad_merge();
        pair_.push_back(std::move(v));
        return true;
      }
      if (v.rfind("#version", 0) == 0) {
        ++merge_index_;
        return true;
      }
      const auto space = v.find(' ');
      if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos)
        return fail(text_error_code::bad_json, merge_field(), "'" + v + "' is not two tokens separated by one space");
      merges->push_back({v.substr(0, space), v.substr(space + 1)});
      ++merge_index_;
      return true;
    }
    return dom_.string(v);
  }
  bool binary(json::binary_t& v) { return capturing() ? bad_entry("binary") : dom_.binary(v); }
  bool start_object(std::size_t n) {
    if (capturing()) return mode_ == mode::vocab ? bad_entry("an object") : bad_merge();
    if (depth_ == 2 && key_at(1) == "model" && key_at(2) == "vocab") {
      mode_ = mode::vocab;
      vocab.emplace();
      ++depth_;
      return true;
    }
    ++depth_;
    return dom_.start_object(n);
  }
  bool end_object() {
    if (mode_ == mode::vocab) {
      mode_ = mode::none;
      --depth_;
      return true;
    }
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (mode_ == mode::vocab) return bad_entry("an array");
    if (mode_ == mode::merges) {
      if (in_pair_) return bad_merge();
      in_pair_ = true;
      pair_.clear();
      return true;
    }
    if (depth_ == 2 && key_at(1) == "model" && key_at(2) == "merges") {
      mode_ = mode::merges;
      merges.emplace();
      ++depth_;
      return true;
    }
    ++depth_;
    return dom_.start_array(n);
  }
  bool end_array() {
    if (mode_ == mode::merges) {
      if (in_pair_) {
        if (pair_.size() != 2) return bad_merge();
        merges->push_back({std::move(pair_[0]), std::move(pair_[1])});
        in_pair_ = false;
        ++merge_index_;
        return true;
      }
      mode_ = mode::none;
      --depth_;
      return true;
    }
    --depth_;
    return dom_.end_array();
  }
  bool key(std::string& k) {
    if (mode_ == mode::vocab) {
      vocab_key_ = k;
      return true;
    }
    if (depth_ < keys_.size()) keys_[depth_] = k;
    return dom_.key(k);
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    syntax_error = e.what();
    return false;
  }

 private:
  enum class mode { none, vocab, merges };

  bool capturing() const { return mode_ != mode::none; }
  std::string_view key_at(std::size_t depth) const {
    return depth < keys_.size() ? std::string_view(keys_[depth]) : std::string_view();
  }
  std::string vocab_field() const { return "model.vocab." + vocab_key_; }
  std::string merge_field() const { return "model.merges[" + std::to_string(merge_index_) + "]"; }
  bool fail(text_error_code code, std::string field, std::string reason) {
    error = text_error{code, "", std::move(field), std::move(reason)};
    return false;
  }
  bool bad_entry(std::string_view kind) {
    if (mode_ == mode::vocab) return fail(text_error_code::bad_json, vocab_field(), "is " + std::string(kind) + ", not a token id");
    return bad_merge();
  }
  bool bad_merge() { return fail(text_error_code::bad_json, merge_field(), "must be \"a b\" or [\"a\", \"b\"]"); }
  bool add_vocab(std::uint64_t id) {
    if (id > INT32_MAX)
      return fail(text_error_code::bad_value, vocab_field(), "token id " + std::to_string(id) + " is out of range");
    vocab->emplace_back(std::move(vocab_key_), static_cast<token_id>(id));
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::size_t depth_ = 0;
  std::array<std::string, 3> keys_;  // the last key seen at depths 1 and 2 (the root is depth 1)
  mode mode_ = mode::none;
  std::string vocab_key_;
  bool in_pair_ = false;  // inside a [left, right] merge
  std::vector<std::string> pair_;
  std::size_t merge_index_ = 0;
};

// The entries of model.vocab: captured by the SAX pass, or read from the document.
result<std::vector<std::pair<std::string, token_id>>, text_error> read_vocab(const reader& r, const json& j,
                                                                             tokenizer_sax& captured) {
  const std::string path = "model";
  std::vector<std::pair<std::string, token_id>> entries;
  if (captured.vocab) {
    entries = std::move(*captured.vocab);
    // A key given twice: the last one counts, as in Hugging Face's map (the model keeps the first).
    std::reverse(entries.begin(), entries.end());
    return entries;
  }
  const json& vocab = member(j, "vocab");
  if (vocab.is_null())
    return troupe::unexpected(r.fail(text_error_code::missing_field, join(path, "vocab"), "is missing"));
  if (!vocab.is_object())
    return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, "vocab"),
                                     "is " + std::string(kind(vocab)) + ", not an object of token ids"));
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    auto id = to_token_id(r, it.value(), join(join(path, "vocab"), it.key()));
    if (!id) return troupe::unexpected(id.error());
    entries.emplace_back(it.key(), *id);
  }
  return entries;
}

result<token_model, text_error> read_wordpiece(const reader& r, const json& j, tokenizer_sax& captured) {
  const std::string path = "model";
  auto entries = read_vocab(r, j, captured);
  if (!entries) return troupe::unexpected(entries.error());
  wordpiece_options options;
  auto unk = get_string(r, j, "unk_token", path);
  if (!unk) return troupe::unexpected(unk.error());
  if (*unk) options.unk_token = **unk;
  auto prefix = get_string(r, j, "continuing_subword_prefix", path);
  if (!prefix) return troupe::unexpected(prefix.error());
  if (*prefix) options.continuing_subword_prefix = **prefix;
  auto max_chars = get_int(r, j, "max_input_chars_per_word", path, 100);
  if (!max_chars) return troupe::unexpected(max_chars.error());
  if (*max_chars < 0)
    return troupe::unexpected(r.fail(text_error_code::bad_value, join(path, "max_input_chars_per_word"),
                                     "must not be negative"));
  options.max_input_chars_per_word = static_cast<std::size_t>(*max_chars);
  auto model = wordpiece_model::from_vocab(std::move(*entries), std::move(options),
                                           wordpiece_source{r.file, join(path, "vocab")});
  if (!model) return troupe::unexpected(model.error());
  return token_model(std::move(*model));
}

result<token_model, text_error> read_model(const reader& r, const json& j, tokenizer_sax& captured) {
  const std::string path = "model";
  if (!j.is_object())
    return troupe::unexpected(r.fail(j.is_null() ? text_error_code::missing_field : text_error_code::bad_json, path,
                                     "must be an object describing the model"));
  auto type = get_string(r, j, "type", path);
  if (!type) return troupe::unexpected(type.error());
  // Older files leave the type out; a merges list says BPE.
  const bool has_merges = captured.merges || !member(j, "merges").is_null();
  const std::string t = type->value_or(has_merges ? "BPE" : "");
  if (t == "WordPiece") return read_wordpiece(r, j, captured);
  if (t != "BPE") {
    if (t.empty()) return troupe::unexpected(r.fail(text_error_code::missing_field, join(path, "type"), "is missing"));
    return troupe::unexpected(unsupported(r, path, "model", t));
  }
  auto entries = read_vocab(r, j, captured);
  if (!entries) return troupe::unexpected(entries.error());
  const std::string merges_path = join(path, "merges");
  std::vector<bpe_merge> pairs;
  if (captured.merges) {
    pairs = std::move(*captured.merges);
  } else if (const json& merges = member(j, "merges"); !merges.is_null()) {
    return troupe::unexpected(r.fail(text_error_code::bad_json, merges_path, "must be an array"));
  }
  bpe_options options;
  auto unk = get_string(r, j, "unk_token", path);
  if (!unk) return troupe::unexpected(unk.error());
  options.unk_token = *unk;
  auto prefix = get_string(r, j, "continuing_subword_prefix", path);
  if (!prefix) return troupe::unexpected(prefix.error());
  options.continuing_subword_prefix = prefix->value_or("");
  auto suffix = get_string(r, j, "end_of_word_suffix", path);
  if (!suffix) return troupe::unexpected(suffix.error());
  options.end_of_word_suffix = suffix->value_or("");
  for (auto [key, flag] : {std::pair{"fuse_unk", &options.fuse_unk}, std::pair{"byte_fallback", &options.byte_fallback},
                           std::pair{"ignore_merges", &options.ignore_merges}}) {
    auto b = get_bool(r, j, key, path, false);
    if (!b) return troupe::unexpected(b.error());
    *flag = *b;
  }
  if (const json& dropout = member(j, "dropout"); !dropout.is_null()) {
    if (!dropout.is_number())
      return troupe::unexpected(r.fail(text_error_code::bad_json, join(path, "dropout"), "must be a number or null"));
    // Dropout makes encoding random; troupe's encoding is a function of the text.
    if (dropout.get<double>() != 0.0)
      return troupe::unexpected(r.fail(text_error_code::unsupported, join(path, "dropout"),
                                       "BPE dropout is not supported for inference"));
  }
  auto model = bpe_model::from_merges(std::move(*entries), pairs, std::move(options),
                                      bpe_source{r.file, join(path, "vocab"), merges_path});
  if (!model) return troupe::unexpected(model.error());
  return token_model(std::move(*model));
}

result<std::vector<added_token>, text_error> read_added_tokens(const reader& r, const json& j) {
  std::vector<added_token> out;
  const std::string path = "added_tokens";
  if (j.is_null()) return out;
  if (!j.is_array()) return troupe::unexpected(r.fail(text_error_code::bad_json, path, "must be an array"));
  for (std::size_t i = 0; i < j.size(); ++i) {
    const json& t = j[i];
    const std::string p = index(path, i);
    if (!t.is_object()) return troupe::unexpected(r.fail(text_error_code::bad_json, p, "must be an object"));
    added_token a;
    const json& id = member(t, "id");
    if (id.is_null()) return troupe::unexpected(r.fail(text_error_code::missing_field, join(p, "id"), "is missing"));
    auto tid = to_token_id(r, id, join(p, "id"));
    if (!tid) return troupe::unexpected(tid.error());
    a.id = *tid;
    auto content = require_string(r, t, "content", p);
    if (!content) return troupe::unexpected(content.error());
    a.content = std::move(*content);
    auto special = get_bool(r, t, "special", p, false);
    if (!special) return troupe::unexpected(special.error());
    a.special = *special;
    for (auto [key, flag, fallback] :
         {std::tuple{"single_word", &a.single_word, false}, std::tuple{"lstrip", &a.lstrip, false},
          std::tuple{"rstrip", &a.rstrip, false}, std::tuple{"normalized", &a.normalized, !a.special}}) {
      auto b = get_bool(r, t, key, p, fallback);
      if (!b) return troupe::unexpected(b.error());
      *flag = *b;
    }
    if (a.content.empty()) continue;  // Hugging Face ignores an empty added token
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

result<tokenizer, text_error> parse_tokenizer_json(std::string_view json_text, std::string name,
                                                   tokenizer_json_options options) {
  const reader r{std::move(name)};
  json doc;
  tokenizer_sax sax(doc);
  const bool parsed = json::sax_parse(json_text, &sax);
  if (sax.error) {
    sax.error->file = r.file;
    return troupe::unexpected(std::move(*sax.error));
  }
  if (!parsed || doc.is_discarded())
    return troupe::unexpected(r.fail(text_error_code::bad_json, "", "not valid JSON: " + sax.syntax_error));
  if (!doc.is_object())
    return troupe::unexpected(r.fail(text_error_code::bad_json, "", "the document is not a JSON object"));

  auto model = read_model(r, member(doc, "model"), sax);
  if (!model) return troupe::unexpected(model.error());
  tokenizer_parts parts{std::move(*model), {}, {}, {}, {}, {}};
  if (auto ok = read_normalizer(r, member(doc, "normalizer"), "normalizer", parts.norm); !ok)
    return troupe::unexpected(ok.error());
  if (auto ok = read_pre_tokenizer(r, member(doc, "pre_tokenizer"), "pre_tokenizer", parts.pre); !ok)
    return troupe::unexpected(ok.error());
  if (auto ok = read_post_processor(r, member(doc, "post_processor"), "post_processor", parts.post); !ok)
    return troupe::unexpected(ok.error());
  if (auto ok = read_decoder(r, member(doc, "decoder"), "decoder", parts.dec); !ok)
    return troupe::unexpected(ok.error());
  auto added = read_added_tokens(r, member(doc, "added_tokens"));
  if (!added) return troupe::unexpected(added.error());
  std::vector<std::string> patterns;
  patterns.reserve(added->size());
  for (const auto& a : *added) patterns.push_back(a.normalized && !parts.norm.empty() ? parts.norm.apply(a.content) : a.content);
  parts.added.set_tokens(std::move(*added), patterns);
  parts.added.set_split_special_tokens(options.split_special_tokens);
  return tokenizer(std::move(parts));
}

result<tokenizer, text_error> load_tokenizer_json(const std::filesystem::path& path, tokenizer_json_options options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return troupe::unexpected(text_error{text_error_code::io, path.string(), "", "cannot open the file"});
  std::ostringstream buf;
  buf << in.rdbuf();
  if (!in.good() && !in.eof())
    return troupe::unexpected(text_error{text_error_code::io, path.string(), "", "cannot read the file"});
  return parse_tokenizer_json(buf.str(), path.string(), options);
}

}  // namespace troupe::text

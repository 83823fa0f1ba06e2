#include "engine/guide/json_schema.hpp"

// What the grammar accepts, where it is narrower than JSON Schema (every choice keeps it a subset: a
// text the grammar accepts is valid against the schema, with the exceptions marked "wider"):
// - Object properties in their declared order, optional ones omitted; additional properties (when
//   allowed) after the declared ones. `additionalProperties` absent counts as false when the schema
//   declares `properties` or `required` (OpenAI strict mode, llama.cpp); `{"type": "object"}` alone is
//   any object. minProperties/maxProperties are refused unless `required` and the declared properties
//   already decide them.
// - Without `type`, the type follows from the keywords (properties -> object, items -> array,
//   minLength -> string, minimum -> number), as llama.cpp does; a schema without any is any value.
// - enum/const values in compact JSON as written (object keys in the schema's order); alongside enum
//   only `type` filters the values.
// - `pattern` matches the whole string (anchored at both ends, like llama.cpp), its characters written
//   in their shortest JSON form (only `"`, `\` and control characters escaped). Not together with
//   minLength/maxLength or format.
// - minLength/maxLength count characters and escapes (a \uD83D\uDE00 pair counts two, as UTF-16 does).
// - `format`: date, time, date-time (RFC 3339, days 01-31 in every month), uuid exactly; email,
//   idn-email, uri, uri-reference, iri, iri-reference, hostname and idn-hostname are any string (format
//   is an annotation by default since draft 2019-09; wider); any other format is refused.
// - Bounded numbers are written without an exponent; the bounds are then exact, decimal bounds
//   included. Integers are canonical (no leading zeros, no "-0"), their bounds exact.
// - oneOf is anyOf (a text matching two branches is accepted; wider). allOf is merged keyword by
//   keyword; conflicting keywords are refused.
// - An additional property's key may equal a declared one when spelled with escapes (wider).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/guide/detail/gbnf_text.hpp"
#include "engine/guide/detail/number_range.hpp"
#include "engine/guide/grammar.hpp"
#include "engine/guide/regex_gbnf.hpp"

namespace troupe::guide {
namespace {

using json = nlohmann::ordered_json;
using detail::group;
using detail::join;
using detail::repeated;

constexpr int max_depth = 64;
constexpr std::size_t max_grammar_bytes = 1u << 20;
constexpr std::int64_t max_count = 10000;  // minItems/maxItems/minLength/maxLength
constexpr int max_visits = 100000;

unexpected<guide_error> fail(guide_error_code code, std::string where, std::string why) {
  return unexpected(guide_error{code, std::move(where), std::move(why)});
}

std::string pointer_token(std::string_view key) {
  std::string s;
  for (char c : key) s += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return s;
}



// The JSON number as written (an integer exactly, a float as its shortest round-trip digits).
detail::decimal to_decimal(const json& v) {
  if (v.is_number_unsigned()) return detail::decimal_from_integer(false, v.get<std::uint64_t>());
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    const auto mag = i < 0 ? 0 - static_cast<std::uint64_t>(i) : static_cast<std::uint64_t>(i);
    return detail::decimal_from_integer(i < 0, mag);
  }
  return detail::decimal_from_double(v.get<double>());
}

// ---- shared rules ---------------------------------------------------------------------------------------

struct primitive {
  std::string_view name, body, deps;  // deps: space-separated rule names
};
constexpr primitive primitives[] = {
    {"space", R"(| " " | "\n" [ \t]{0,20})", ""},
    {"char", R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))", ""},
    {"string", R"("\"" char* "\"" space)", "char space"},
    {"number", R"("-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? space)", "space"},
    {"integer", R"("-"? ("0" | [1-9] [0-9]*) space)", "space"},
    {"boolean", R"(("true" | "false") space)", "space"},
    {"null", R"("null" space)", "space"},
    {"value", "object | array | string | number | boolean | null", "object array string number boolean null"},
    {"object", R"("{" space (string ":" space value ("," space string ":" space value)*)? "}" space)", "space string value"},
    {"array", R"("[" space (value ("," space value)*)? "]" space)", "space value"},
    // A calendar date as ajv's "date" format checks it: each month's own length, February 29 in leap
    // years only (divisible by 4 and not by 100, or by 400; year 0000 is one).
    {"date", R"([0-9]{4} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])) | leap-year "-02-29")", "leap-year"},
    {"leap-year", R"([0-9] [0-9] ("0" [48] | [2468] [048] | [13579] [26]) | ([02468] [048] | [13579] [26]) "00")", ""},
    {"time", R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" ([0-5] [0-9] | "60") ("." [0-9]+)? ([zZ] | [-+] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))", ""},
    {"date-time", "date [tT] time", "date time"},
    {"uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})", ""},
    {"date-string", R"("\"" date "\"" space)", "date space"},
    {"time-string", R"("\"" time "\"" space)", "time space"},
    {"date-time-string", R"("\"" date-time "\"" space)", "date-time space"},
    {"uuid-string", R"("\"" uuid "\"" space)", "uuid space"},
};

constexpr std::string_view annotations[] = {"title", "description", "examples", "example", "default", "$schema",
                                            "$id", "$comment", "$defs", "definitions", "deprecated", "readOnly",
                                            "writeOnly", "$anchor", "contentEncoding", "contentMediaType",
                                            "discriminator", "$vocabulary"};
constexpr std::string_view refused[] = {"not", "if", "then", "else", "patternProperties", "dependentRequired",
                                        "dependentSchemas", "dependencies", "multipleOf", "contains", "minContains",
                                        "maxContains", "unevaluatedProperties", "unevaluatedItems", "propertyNames",
                                        "$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor"};
constexpr std::string_view type_names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
constexpr std::string_view plain_formats[] = {"email", "idn-email", "uri", "uri-reference", "iri",
                                              "iri-reference", "hostname", "idn-hostname"};

template <std::size_t N>
bool among(const std::string_view (&set)[N], std::string_view s) {
  return std::find(std::begin(set), std::end(set), s) != std::end(set);
}

std::string sanitize(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
  return out.empty() ? "x" : out;
}

// The characters of valid UTF-8 (nlohmann has checked it), each as its bytes.
std::vector<std::string> characters(std::string_view s) {
  std::vector<std::string> out;
  for (std::size_t i = 0, n = 1; i < s.size(); i += n) {
    const auto c = static_cast<unsigned char>(s[i]);
    n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.emplace_back(s.substr(i, n));
  }
  return out;
}

struct trie {
  bool word = false;
  std::map<std::string, trie> kids;  // by character
};

// JSON string bodies that spell none of the trie's words (an escape never equals a plain character).
std::string not_words(const trie& t) {
  std::vector<std::string> alts;
  if (!t.word) alts.emplace_back();
  std::string excluded;  // the next characters of words, out of the class of other characters
  for (const auto& [ch, kid] : t.kids) {
    const auto spelled = json(ch).dump();
    alts.push_back(gbnf_literal(spelled.substr(1, spelled.size() - 2)) + " " + not_words(kid));
    const auto c = static_cast<unsigned char>(ch[0]);
    if (ch.size() > 1 || std::isalnum(c)) excluded += ch;  // a class reads UTF-8 as its code point
    else if (c >= 0x20 && c != '"' && c != '\\') excluded += "\\x" + std::string(1, "0123456789ABCDEF"[c >> 4]) + "0123456789ABCDEF"[c & 15];
  }
  alts.push_back(R"([^"\\\x00-\x1F)" + excluded + "] char*");
  alts.push_back(R"("\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) char*)");
  return "(" + group(alts) + ")";
}

// Nesting of the JSON text, strings skipped: bounds every recursive walk of the document.
std::size_t text_depth(std::string_view s) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

using expr = result<std::string, guide_error>;  // a rule name

class converter {
 public:
  explicit converter(const json& doc) : doc_(doc) {}

  expr run() {
    reserve("root");
    auto root = visit(doc_, "root", "", 0);
    if (!root) return root;
    if (*root != "root") define("root", *root);
    if (bytes_ > max_grammar_bytes)
      return fail(guide_error_code::too_large, "", "the grammar is past " + std::to_string(max_grammar_bytes) + " bytes");
    std::string out;
    for (const auto& [n, b] : rules_)
      if (n == "root") out = n + " ::= " + b + "\n" + out;
      else out += n + " ::= " + b + "\n";
    return out;
  }

 private:
  const json& doc_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::unordered_map<std::string, std::size_t> index_;
  std::unordered_map<std::string, std::string> by_body_;
  std::vector<std::string> placeholders_;
  std::map<std::string, std::string> refs_;  // "$ref" value -> rule
  std::map<std::string, int> in_progress_;   // "$ref" value -> guard_ when its rule was entered
  int guard_ = 0;                            // object members and array items entered (bytes consumed)
  int visits_ = 0;
  std::size_t bytes_ = 0;

  std::string unique(const std::string& hint) {
    if (!index_.contains(hint)) return hint;
    for (int i = 1;; ++i)
      if (auto n = hint + "-" + std::to_string(i); !index_.contains(n)) return n;
  }
  std::string reserve(const std::string& hint) {
    auto name = unique(hint);
    index_[name] = rules_.size();
    rules_.emplace_back(name, "");
    placeholders_.push_back(name);
    return name;
  }
  void define(const std::string& name, std::string body) {
    std::erase(placeholders_, name);
    bytes_ += name.size() + body.size() + 6;
    rules_[index_.at(name)].second = std::move(body);
  }
  std::string add_rule(const std::string& hint, std::string body) {
    if (std::find(placeholders_.begin(), placeholders_.end(), hint) != placeholders_.end()) {
      define(hint, std::move(body));
      return hint;
    }
    if (auto it = by_body_.find(body); it != by_body_.end()) return it->second;
    auto name = unique(hint);
    index_[name] = rules_.size();
    by_body_[body] = name;
    bytes_ += name.size() + body.size() + 6;
    rules_.emplace_back(name, std::move(body));
    return name;
  }
  std::string prim(std::string_view name) {
    if (index_.contains(std::string(name))) return std::string(name);
    for (const auto& p : primitives) {
      if (p.name != name) continue;
      index_[std::string(name)] = rules_.size();
      rules_.emplace_back(std::string(name), std::string(p.body));
      bytes_ += name.size() + p.body.size() + 6;
      for (std::string_view deps = p.deps; !deps.empty();) {
        const auto sp = deps.find(' ');
        prim(deps.substr(0, sp));
        deps = sp == std::string_view::npos ? "" : deps.substr(sp + 1);
      }
    }
    return std::string(name);
  }

  // A non-negative integer keyword (count), absent: nullopt.
  result<std::optional<std::int64_t>, guide_error> count(const json& s, const char* key, const std::string& where) {
    if (!s.contains(key)) return std::optional<std::int64_t>{};
    const auto& v = s[key];
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() != std::floor(v.get<double>()))
      return fail(guide_error_code::bad_schema, where + "/" + key, std::string(key) + " must be a non-negative integer");
    const double d = v.get<double>();
    if (d > static_cast<double>(max_count))
      return fail(guide_error_code::too_large, where + "/" + key, std::string(key) + " is past " + std::to_string(max_count));
    return std::optional<std::int64_t>{static_cast<std::int64_t>(d)};
  }

  expr visit(const json& s, const std::string& name, const std::string& where, int depth) {
    if (++visits_ > max_visits || bytes_ > max_grammar_bytes)
      return fail(guide_error_code::too_large, where, "the grammar is past its bounds");
    if (depth > max_depth) return fail(guide_error_code::too_large, where, "the schema nests deeper than " + std::to_string(max_depth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return prim("value");
      return fail(guide_error_code::unsupported, where, "the schema false matches nothing");
    }
    if (!s.is_object()) return fail(guide_error_code::bad_schema, where, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      const auto& k = it.key();
      if (among(refused, k) && !(k.starts_with("unevaluated") && it.value() == true))
        return fail(guide_error_code::unsupported, where + "/" + pointer_token(k), "the keyword '" + k + "' is not supported");
    }
    if (s.contains("uniqueItems")) {
      if (!s["uniqueItems"].is_boolean()) return fail(guide_error_code::bad_schema, where + "/uniqueItems", "uniqueItems must be a boolean");
      if (s["uniqueItems"].get<bool>()) return fail(guide_error_code::unsupported, where + "/uniqueItems", "uniqueItems: true is not supported");
    }
    if (s.contains("nullable") && !s["nullable"].is_boolean()) return fail(guide_error_code::bad_schema, where + "/nullable", "nullable must be a boolean");
    const bool nullable = s.value("nullable", false);

    if (s.contains("$ref") || s.contains("allOf")) {
      if (s.contains("$ref") && !s.contains("allOf")) {
        json rest = s;
        rest.erase("$ref");
        if (!validating(rest)) return ref_rule(s["$ref"], where, depth);
      }
      auto flat = flatten(s, where, depth);
      if (!flat) return unexpected(flat.error());
      return visit(*flat, name, where, depth + 1);
    }
    if (s.contains("anyOf") || s.contains("oneOf")) {
      if (s.contains("anyOf") && s.contains("oneOf")) return fail(guide_error_code::unsupported, where, "anyOf together with oneOf is not supported");
      const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
      const auto& branches = s[key];
      if (!branches.is_array() || branches.empty()) return fail(guide_error_code::bad_schema, where + "/" + key, key + " must be a non-empty array");
      json rest = s;
      rest.erase(key);
      rest.erase("nullable");
      const bool shared = validating(rest);
      std::vector<std::string> alts;
      for (std::size_t i = 0; i < branches.size(); ++i) {
        const auto bw = where + "/" + key + "/" + std::to_string(i);
        if (branches[i] == false) continue;
        auto r = [&]() -> expr {
          if (!shared) return visit(branches[i], name + "-" + std::to_string(i), bw, depth + 1);
          auto flat = flatten(branches[i] == true ? json::object() : branches[i], bw, depth);
          if (!flat) return unexpected(flat.error());
          auto merged = merge(rest, *flat, bw);
          if (!merged) return unexpected(merged.error());
          return visit(*merged, name + "-" + std::to_string(i), bw, depth + 1);
        }();
        if (!r) return r;
        alts.push_back(*r);
      }
      if (nullable) alts.push_back(prim("null"));
      if (alts.empty()) return fail(guide_error_code::unsupported, where + "/" + key, "no branch of " + key + " can match");
      return alts.size() == 1 ? alts[0] : add_rule(name, join(alts, " | "));
    }

    std::vector<std::string> types;
    if (s.contains("type")) {
      const auto& t = s["type"];
      const bool ok = t.is_string() || (t.is_array() && !t.empty() && std::all_of(t.begin(), t.end(), [](const json& e) { return e.is_string(); }));
      if (!ok) return fail(guide_error_code::bad_schema, where + "/type", "type must be a type name or a non-empty array of them");
      for (const auto& e : t.is_string() ? json::array({t}) : t) {
        if (!among(type_names, e.get<std::string>())) return fail(guide_error_code::bad_schema, where + "/type", "unknown type '" + e.get<std::string>() + "'");
        types.push_back(e.get<std::string>());
      }
    }
    if (s.contains("const") || s.contains("enum")) return enum_rule(s, types, nullable, name, where);
    if (!s.contains("type")) {
      auto any_of = [&](std::initializer_list<const char*> keys) {
        return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
      };
      if (any_of({"properties", "additionalProperties", "required", "minProperties", "maxProperties"})) types.push_back("object");
      if (any_of({"items", "prefixItems", "additionalItems", "minItems", "maxItems"})) types.push_back("array");
      if (any_of({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
      if (any_of({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
      if (types.empty()) return prim("value");
    }
    if (std::find(types.begin(), types.end(), "number") != types.end()) std::erase(types, "integer");
    if (nullable && std::find(types.begin(), types.end(), "null") == types.end()) types.push_back("null");
    std::vector<std::string> alts;
    for (const auto& t : types) {
      const auto tn = types.size() == 1 ? name : name + "-" + t;
      expr r = t == "object"  ? object_rule(s, tn, where, depth)
               : t == "array" ? array_rule(s, tn, where, depth)
               : t == "string" ? string_rule(s, tn, where)
               : t == "number" || t == "integer" ? number_rule(s, tn, where, t == "integer")
                                                 : expr(prim(t));
      if (!r) return r;
      if (std::find(alts.begin(), alts.end(), *r) == alts.end()) alts.push_back(*r);
    }
    return alts.size() == 1 ? alts[0] : add_rule(name, join(alts, " | "));
  }

  static bool validating(const json& s) {
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!among(annotations, it.key()) && !(it.key() == "nullable" && it.value() == false)) return true;
    return false;
  }

  result<std::pair<const json*, std::string>, guide_error> resolve(const std::string& ref, const std::string& where) {
    if (ref.empty() || ref[0] != '#') return fail(guide_error_code::unsupported, where, "references to other documents ('" + ref + "') are not supported");
    std::string frag;
    for (std::size_t i = 1; i < ref.size(); ++i) {  // the fragment is URI-encoded
      if (ref[i] == '%' && i + 2 < ref.size() && std::isxdigit(static_cast<unsigned char>(ref[i + 1])) && std::isxdigit(static_cast<unsigned char>(ref[i + 2]))) {
        frag += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        frag += ref[i];
      }
    }
    if (!frag.empty() && frag[0] != '/') return fail(guide_error_code::unsupported, where, "anchor references ('" + ref + "') are not supported");
    const json* cur = &doc_;
    for (std::size_t p = 0; p < frag.size();) {
      const auto next = frag.find('/', p + 1);
      std::string tok, raw = frag.substr(p + 1, next == std::string::npos ? std::string::npos : next - p - 1);
      for (std::size_t i = 0; i < raw.size(); ++i)
        tok += raw[i] == '~' && i + 1 < raw.size() ? (raw[++i] == '1' ? '/' : '~') : raw[i];
      p = next == std::string::npos ? frag.size() : next;
      if (cur->is_object() && cur->contains(tok)) {
        cur = &(*cur)[tok];
      } else if (cur->is_array() && !tok.empty() && tok.size() < 10 && tok.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(tok) < cur->size()) {
        cur = &(*cur)[std::stoul(tok)];
      } else {
        return fail(guide_error_code::bad_schema, where, "$ref '" + ref + "' points at nothing");
      }
    }
    return std::pair{cur, frag};
  }

  expr ref_rule(const json& ref, const std::string& where, int depth) {
    if (!ref.is_string()) return fail(guide_error_code::bad_schema, where + "/$ref", "$ref must be a string");
    const auto key = ref.get<std::string>();
    if (auto it = refs_.find(key); it != refs_.end()) {
      if (auto p = in_progress_.find(key); p != in_progress_.end() && p->second == guard_)
        return fail(guide_error_code::unsupported, where + "/$ref", "'" + key + "' reaches itself before any input (left recursion)");
      return it->second;
    }
    auto target = resolve(key, where + "/$ref");
    if (!target) return unexpected(target.error());
    const auto& ptr = target->second;
    const auto name = reserve("def-" + sanitize(ptr.empty() ? "root" : ptr.substr(ptr.rfind('/') + 1)));
    refs_[key] = name;
    in_progress_[key] = guard_;
    auto body = visit(*target->first, name, ptr, depth + 1);
    in_progress_.erase(key);
    if (!body) return body;
    if (*body != name) define(name, *body);
    return name;
  }

  // The schema with $ref and allOf merged into one object schema.
  result<json, guide_error> flatten(const json& s, const std::string& where, int depth) {
    if (depth > max_depth) return fail(guide_error_code::too_large, where, "the schema nests deeper than " + std::to_string(max_depth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return json::object();
      return fail(guide_error_code::unsupported, where, "the schema false matches nothing");
    }
    if (!s.is_object()) return fail(guide_error_code::bad_schema, where, "a schema must be an object or a boolean");
    json out = s;
    out.erase("$ref");
    out.erase("allOf");
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return fail(guide_error_code::bad_schema, where + "/$ref", "$ref must be a string");
      auto target = resolve(s["$ref"].get<std::string>(), where + "/$ref");
      if (!target) return unexpected(target.error());
      auto t = flatten(*target->first, target->second, depth + 1);
      if (!t) return t;
      auto m = merge(*t, out, where);
      if (!m) return m;
      out = std::move(*m);
    }
    if (s.contains("allOf")) {
      const auto& parts = s["allOf"];
      if (!parts.is_array() || parts.empty()) return fail(guide_error_code::bad_schema, where + "/allOf", "allOf must be a non-empty array");
      for (std::size_t i = 0; i < parts.size(); ++i) {
        const auto pw = where + "/allOf/" + std::to_string(i);
        auto p = flatten(parts[i], pw, depth + 1);
        if (!p) return p;
        auto m = merge(out, *p, pw);
        if (!m) return m;
        out = std::move(*m);
      }
    }
    return out;
  }

  // Both schemas at once, keyword by keyword (neither has $ref or allOf at its top).
  static result<json, guide_error> merge(const json& a, const json& b, const std::string& where) {
    json out = a;
    for (auto it = b.begin(); it != b.end(); ++it) {
      const auto& k = it.key();
      const auto& v = it.value();
      if (among(annotations, k)) continue;
      if (!out.contains(k)) {
        out[k] = v;
        continue;
      }
      auto& cur = out[k];
      if (cur == v) continue;
      auto names = [](const json& t) { return t.is_string() ? json::array({t}) : t; };
      if (k == "type") {
        json both = json::array();
        for (const auto& x : names(cur))
          for (const auto& y : names(v))
            if (x == y || (x == "number" && y == "integer")) both.push_back(y);
            else if (x == "integer" && y == "number") both.push_back(x);
        if (both.empty()) return fail(guide_error_code::unsupported, where + "/type", "no type satisfies every part of allOf");
        cur = both.size() == 1 ? both[0] : both;
      } else if (k == "required" && cur.is_array() && v.is_array()) {
        for (const auto& r : v)
          if (std::find(cur.begin(), cur.end(), r) == cur.end()) cur.push_back(r);
      } else if (k == "properties" && cur.is_object() && v.is_object()) {
        for (auto p = v.begin(); p != v.end(); ++p)
          if (!cur.contains(p.key())) cur[p.key()] = p.value();
          else if (cur[p.key()] != p.value()) cur[p.key()] = json{{"allOf", json::array({cur[p.key()], p.value()})}};
      } else if (cur.is_number() && v.is_number() && (k.starts_with("min") || k == "exclusiveMinimum")) {
        if (detail::compare(to_decimal(v), to_decimal(cur)) > 0) cur = v;
      } else if (cur.is_number() && v.is_number() && (k.starts_with("max") || k == "exclusiveMaximum")) {
        if (detail::compare(to_decimal(v), to_decimal(cur)) < 0) cur = v;
      } else if (k == "enum" && cur.is_array() && v.is_array()) {
        json both = json::array();
        for (const auto& x : cur)
          if (std::find(v.begin(), v.end(), x) != v.end()) both.push_back(x);
        cur = both;
      } else if (k == "nullable" && cur.is_boolean() && v.is_boolean()) {
        cur = cur.get<bool>() && v.get<bool>();
      } else {
        return fail(guide_error_code::unsupported, where + "/" + pointer_token(k), "the parts of allOf disagree on '" + k + "'");
      }
    }
    return out;
  }

  expr enum_rule(const json& s, const std::vector<std::string>& types, bool nullable, const std::string& name, const std::string& where) {
    json values = json::array();
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) return fail(guide_error_code::bad_schema, where + "/enum", "enum must be an array");
      values = s["enum"];
    }
    if (s.contains("const")) {
      if (s.contains("enum") && std::find(values.begin(), values.end(), s["const"]) == values.end()) values = json::array();
      else values = json::array({s["const"]});
    }
    auto fits = [&](const json& v) {
      if (types.empty()) return true;
      for (const auto& t : types) {
        if ((t == "object" && v.is_object()) || (t == "array" && v.is_array()) || (t == "string" && v.is_string()) ||
            (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
            (t == "integer" && (v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))))
          return true;
      }
      return false;
    };
    std::vector<std::string> alts;
    for (const auto& v : values)
      if (fits(v) || (nullable && v.is_null())) {
        auto lit = gbnf_literal(v.dump());
        if (std::find(alts.begin(), alts.end(), lit) == alts.end()) alts.push_back(std::move(lit));
      }
    if (nullable && std::find(alts.begin(), alts.end(), "\"null\"") == alts.end()) alts.push_back("\"null\"");
    if (alts.empty()) return fail(guide_error_code::unsupported, where + (s.contains("enum") ? "/enum" : "/const"), "no value of enum/const fits the schema");
    prim("space");
    return add_rule(name, group(alts) + " space");
  }

  expr string_rule(const json& s, const std::string& name, const std::string& where) {
    auto min = count(s, "minLength", where);
    if (!min) return unexpected(min.error());
    auto max = count(s, "maxLength", where);
    if (!max) return unexpected(max.error());
    const bool lengths = min->value_or(0) > 0 || max->has_value();
    if (s.contains("format")) {
      if (!s["format"].is_string()) return fail(guide_error_code::bad_schema, where + "/format", "format must be a string");
      const auto f = s["format"].get<std::string>();
      if (f == "date" || f == "time" || f == "date-time" || f == "uuid") {
        if (lengths || s.contains("pattern")) return fail(guide_error_code::unsupported, where + "/format", "format '" + f + "' together with pattern or lengths is not supported");
        return prim(f + "-string");
      }
      if (!among(plain_formats, f)) return fail(guide_error_code::unsupported, where + "/format", "format '" + f + "' is not supported");
    }
    prim("space");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return fail(guide_error_code::bad_schema, where + "/pattern", "pattern must be a string");
      if (lengths) return fail(guide_error_code::unsupported, where + "/pattern", "pattern together with minLength/maxLength is not supported");
      auto e = regex_to_gbnf_expression(s["pattern"].get<std::string>(), regex_alphabet::json_string);
      if (!e) return fail(e.error().code, where + "/pattern", e.error().reason + " (" + e.error().where + ")");
      return add_rule(name, join({"\"\\\"\"", e->empty() ? "" : "(" + *e + ")", "\"\\\"\" space"}, " "));
    }
    if (*max && min->value_or(0) > **max) return fail(guide_error_code::unsupported, where + "/minLength", "minLength is past maxLength");
    if (!lengths) return prim("string");
    return add_rule(name, join({"\"\\\"\"", repeated(prim("char"), min->value_or(0), max->value_or(-1)), "\"\\\"\" space"}, " "));
  }

  // minimum/exclusiveMinimum (lower) or maximum/exclusiveMaximum, the tighter one; draft 4's boolean
  // exclusiveMinimum makes minimum exclusive.
  result<std::optional<detail::bound>, guide_error> read_bound(const json& s, bool lower, const std::string& where) {
    const char* inc = lower ? "minimum" : "maximum";
    const char* exc = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    std::optional<detail::bound> b;
    bool draft4 = false;
    if (s.contains(exc)) {
      const auto& v = s[exc];
      if (v.is_boolean()) draft4 = v.get<bool>();
      else if (v.is_number()) b = detail::bound{to_decimal(v), true};
      else return fail(guide_error_code::bad_schema, where + "/" + exc, std::string(exc) + " must be a number or a boolean");
    }
    if (s.contains(inc)) {
      if (!s[inc].is_number()) return fail(guide_error_code::bad_schema, where + "/" + inc, std::string(inc) + " must be a number");
      const detail::bound c{to_decimal(s[inc]), draft4};
      const int cmp = b ? detail::compare(c.v, b->v) : 0;
      if (!b || (lower ? cmp > 0 : cmp < 0)) b = c;
    }
    return b;
  }

  expr number_rule(const json& s, const std::string& name, const std::string& where, bool integer) {
    auto lo = read_bound(s, true, where);
    if (!lo) return unexpected(lo.error());
    auto hi = read_bound(s, false, where);
    if (!hi) return unexpected(hi.error());
    if (!*lo && !*hi) return prim(integer ? "integer" : "number");
    prim("space");
    const auto empty = [&] { return fail(guide_error_code::unsupported, where, std::string("no ") + (integer ? "integer" : "number") + " is within minimum and maximum"); };
    if (integer) {
      std::optional<detail::decimal> a, b;
      if (*lo) a = detail::to_integer((*lo)->v, true, (*lo)->exclusive);
      if (*hi) b = detail::to_integer((*hi)->v, false, (*hi)->exclusive);
      if (a && b && detail::compare(*a, *b) > 0) return empty();
      return add_rule(name, detail::integer_range(a, b) + " space");
    }
    if (*lo && *hi) {
      const int c = detail::compare((*lo)->v, (*hi)->v);
      if (c > 0 || (c == 0 && ((*lo)->exclusive || (*hi)->exclusive))) return empty();
    }
    auto r = detail::number_range(*lo, *hi);
    if (!r) return empty();
    return add_rule(name, *r + " space");
  }

  expr object_rule(const json& s, const std::string& name, const std::string& where, int depth) {
    static const json any = true;
    std::vector<std::pair<std::string, const json*>> props;
    std::vector<bool> req;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return fail(guide_error_code::bad_schema, where + "/properties", "properties must be an object");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) props.emplace_back(it.key(), &it.value());
    }
    req.assign(props.size(), false);
    if (s.contains("required")) {
      const auto& r = s["required"];
      if (!r.is_array() || !std::all_of(r.begin(), r.end(), [](const json& e) { return e.is_string(); }))
        return fail(guide_error_code::bad_schema, where + "/required", "required must be an array of strings");
      for (const auto& e : r) {
        auto it = std::find_if(props.begin(), props.end(), [&](const auto& p) { return p.first == e.get<std::string>(); });
        if (it == props.end()) {
          props.emplace_back(e.get<std::string>(), &any);
          req.push_back(true);
        } else {
          req[static_cast<std::size_t>(it - props.begin())] = true;
        }
      }
    }
    // additionalProperties absent: false once properties or required are declared (OpenAI strict mode).
    bool extra = !(s.contains("properties") || s.contains("required"));
    const json* extra_schema = &any;
    if (s.contains("additionalProperties")) {
      const auto& a = s["additionalProperties"];
      if (a.is_boolean()) extra = a.get<bool>();
      else if (a.is_object()) extra = true, extra_schema = &a;
      else return fail(guide_error_code::bad_schema, where + "/additionalProperties", "additionalProperties must be a schema");
    }
    auto min = count(s, "minProperties", where);
    if (!min) return unexpected(min.error());
    auto max = count(s, "maxProperties", where);
    if (!max) return unexpected(max.error());
    const auto required = static_cast<std::int64_t>(std::count(req.begin(), req.end(), true));
    if (min->value_or(0) > required || (*max && (extra || **max < static_cast<std::int64_t>(props.size()))))
      return fail(guide_error_code::unsupported, where + (min->value_or(0) > required ? "/minProperties" : "/maxProperties"),
                  "minProperties/maxProperties are supported only where required and the declared properties decide them");
    if (props.empty() && extra && (*extra_schema == true || *extra_schema == json::object())) return prim("object");

    const std::string space = prim("space"), comma = "\",\" space ";
    std::vector<std::string> kv;
    std::string extra_kv;
    ++guard_;
    for (const auto& [key, schema] : props) {
      auto v = visit(*schema, name + "-" + sanitize(key), where + "/properties/" + pointer_token(key), depth + 1);
      if (!v) return --guard_, v;
      kv.push_back(gbnf_literal(json(key).dump()) + " space \":\" space " + *v);
    }
    if (extra) {
      auto v = visit(*extra_schema, name + "-additional-value", where + "/additionalProperties", depth + 1);
      if (!v) return --guard_, v;
      std::string key_rule = prim("string");
      if (!props.empty()) {
        trie t;
        for (const auto& p : props) {
          trie* n = &t;
          for (const auto& ch : characters(p.first)) n = &n->kids[ch];
          n->word = true;
        }
        prim("char");
        key_rule = add_rule(name + "-additional-key", "\"\\\"\" " + not_words(t) + " \"\\\"\" space");
      }
      extra_kv = add_rule(name + "-additional-kv", key_rule + " \":\" space " + *v);
    }
    --guard_;

    // Declared properties in order, optional ones omitted, additional ones after them. after(j): the
    // properties from j on once one has been written (each behind a comma).
    const std::size_t n = props.size();
    const std::string tail = extra ? "(" + comma + extra_kv + ")*" : "";
    std::vector<std::string> items;
    for (std::size_t j = 0; j < n; ++j) items.push_back(req[j] ? comma + kv[j] : "(" + comma + kv[j] + ")?");
    const std::size_t r = static_cast<std::size_t>(std::find(req.begin(), req.end(), true) - req.begin());
    const std::size_t m = n == 0 ? 0 : std::min(r, n - 1) + 1;  // alternatives for the first written property
    std::vector<std::string> after(m + 1);
    for (std::size_t j = m; j >= 1; --j) {
      std::string body = j == m ? join({join(std::vector<std::string>(items.begin() + static_cast<std::ptrdiff_t>(m), items.end()), " "), tail}, " ")
                                : join({items[j], after[j + 1]}, " ");
      after[j] = j >= 2 && !body.empty() ? add_rule(name + "-after-" + std::to_string(j), body) : body;
    }
    std::vector<std::string> first;
    for (std::size_t i = 0; i < m; ++i) first.push_back(join({kv[i], after[i + 1]}, " "));
    if (r >= n) {
      first.emplace_back();
      if (extra) first.push_back(extra_kv + " " + tail);
    }
    return add_rule(name, join({"\"{\" space", group(first), "\"}\" space"}, " "));
  }

  expr array_rule(const json& s, const std::string& name, const std::string& where, int depth) {
    static const json any = true;
    std::vector<const json*> prefix;
    const json* extra = &any;
    std::string prefix_where = "/prefixItems", extra_where = "/items";
    auto is_schema = [](const json& j) { return j.is_object() || j.is_boolean(); };
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return fail(guide_error_code::bad_schema, where + "/prefixItems", "prefixItems must be an array");
      for (const auto& p : s["prefixItems"]) prefix.push_back(&p);
      if (s.contains("items")) extra = &s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {  // draft 4 tuples
      for (const auto& p : s["items"]) prefix.push_back(&p);
      prefix_where = "/items";
      if (s.contains("additionalItems")) extra = &s["additionalItems"], extra_where = "/additionalItems";
    } else if (s.contains("items")) {
      extra = &s["items"];
    }
    if (!is_schema(*extra)) return fail(guide_error_code::bad_schema, where + extra_where, extra_where.substr(1) + " must be a schema");
    auto min_items = count(s, "minItems", where);
    if (!min_items) return unexpected(min_items.error());
    auto max_items = count(s, "maxItems", where);
    if (!max_items) return unexpected(max_items.error());
    const std::int64_t k = static_cast<std::int64_t>(prefix.size()), min = min_items->value_or(0);
    const bool more = *extra != false;
    std::int64_t max = max_items->value_or(-1);
    if (!more) max = max < 0 ? k : std::min(max, k);
    if (max >= 0 && min > max) return fail(guide_error_code::unsupported, where + "/minItems", "no array length fits minItems, maxItems and the items");
    if (k == 0 && (*extra == true || *extra == json::object()) && min == 0 && max < 0) return prim("array");

    const std::string comma = "\",\" space ";
    prim("space");
    std::vector<std::string> p;
    std::string e;
    ++guard_;
    for (std::int64_t i = 0; i < k && (max < 0 || i < max); ++i) {
      auto v = visit(*prefix[static_cast<std::size_t>(i)], name + "-" + std::to_string(i), where + prefix_where + "/" + std::to_string(i), depth + 1);
      if (!v) return --guard_, v;
      p.push_back(*v);
    }
    if (more && (max < 0 || max > k)) {
      auto v = visit(*extra, name + "-item", where + extra_where, depth + 1);
      if (!v) return --guard_, v;
      e = *v;
    }
    --guard_;
    // cont(j): the elements after the first j.
    auto cont_extra = [&](std::int64_t j) {
      if (e.empty() || (max >= 0 && max <= j)) return std::string();
      return repeated("(" + comma + e + ")", std::max<std::int64_t>(min - j, 0), max < 0 ? -1 : max - j);
    };
    std::string cont = cont_extra(std::max<std::int64_t>(k, 1));
    for (std::int64_t j = k - 1; j >= 1; --j) {
      if (max >= 0 && j >= max) {
        cont.clear();
        continue;
      }
      const auto x = join({comma + p[static_cast<std::size_t>(j)], cont}, " ");
      cont = j >= min ? "(" + x + ")?" : x;
    }
    std::string inner;
    if (max != 0) {
      inner = join({k >= 1 ? p[0] : e, cont}, " ");
      if (min == 0) inner = "(" + inner + ")?";
    }
    return add_rule(name, join({"\"[\" space", inner, "\"]\" space"}, " "));
  }
};

}  // namespace

result<std::string, guide_error> json_schema_to_gbnf(std::string_view schema_json) {
  if (schema_json.size() > max_grammar_bytes)
    return fail(guide_error_code::too_large, "", "the schema is past " + std::to_string(max_grammar_bytes) + " bytes");
  if (text_depth(schema_json) > 4 * max_depth)
    return fail(guide_error_code::too_large, "", "the schema nests deeper than " + std::to_string(4 * max_depth));
  const auto doc = json::parse(schema_json.begin(), schema_json.end(), nullptr, false);
  if (doc.is_discarded()) return fail(guide_error_code::bad_schema, "", "the schema is not JSON");
  return converter(doc).run();
}

std::string json_object_gbnf() {
  const json object_schema = {{"type", "object"}};
  return converter(object_schema).run().value_or("root ::= object\n");
}

}  // namespace troupe::guide

// Filters and tests. Each filter does what the reference does for the types it accepts; where the
// reference refuses a filter or a type that Jinja accepts (select, reject, round, wordcount, escape,
// count, d, first of a string, ...), troupe follows Jinja.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <unordered_set>

#include "engine/text/jinja/detail/evaluator.hpp"
#include "engine/text/jinja/detail/js_text.hpp"

namespace troupe::text::jinja {
namespace {

using namespace detail;

constexpr std::array known_filters = {
    "abs",    "capitalize", "count",   "d",          "default", "dictsort", "e",       "escape",
    "first",  "float",      "indent",  "int",        "items",   "join",     "last",    "length",
    "list",   "lower",      "map",     "reject",     "rejectattr", "replace", "reverse", "round",
    "safe",   "select",     "selectattr", "sort",    "string",  "title",    "tojson",  "trim",
    "unique", "upper",      "wordcount", "bool",     "keys",    "values",   "get",
};


template <std::size_t N>
bool known(const std::array<const char*, N>& names, std::string_view name) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return name == n; });
}

std::string kind_name(const value& v) { return a_kind(v.kind()); }

// A positional argument, else a keyword one, else the fallback.
value argument(const call_args& args, std::size_t i, const char* key, value fallback) {
  if (i < args.positional.size()) return args.positional[i];
  if (const value* v = args.keyword.find(key)) return *v;
  return fallback;
}

// A key that is equal for values JavaScript's Set treats as one (SameValueZero): numbers by value,
// strings by content, containers and functions by identity.
std::string same_value_key(const value& v) {
  switch (v.kind()) {
    case value_kind::undefined:
    case value_kind::none: return "u";
    case value_kind::boolean: return v.as_bool() ? "t" : "f";
    case value_kind::integer:
    case value_kind::floating: {
      double d = v.as_number();
      if (d == 0) d = 0;
      if (std::isnan(d)) return "#nan";
      char buf[sizeof(double)];
      std::memcpy(buf, &d, sizeof d);
      return "#" + std::string(buf, sizeof buf);
    }
    case value_kind::string: return "s" + v.as_string();
    default: {
      char buf[sizeof(void*)];
      const void* p = v.identity();
      std::memcpy(buf, &p, sizeof p);
      return "o" + std::string(buf, sizeof buf);
    }
  }
}

// The value at a dotted path ("a.b.0"): map keys and list indices; undefined when any step is missing.
value attribute_path(const value& item, std::string_view path) {
  value v = item;
  while (true) {
    const auto dot = path.find('.');
    const std::string part(path.substr(0, dot));
    if (v.is_attribute_container()) {
      const value* found = v.as_map().entries.find(part);
      v = found ? *found : value();
    } else if (v.is_list()) {
      auto index = js_parse_int(part);
      const auto& items = v.as_list().items;
      if (!index || *index < 0 || *index >= static_cast<double>(items.size())) return value();
      v = items[static_cast<std::size_t>(*index)];
    } else {
      return value();
    }
    if (dot == std::string_view::npos) return v;
    path.remove_prefix(dot + 1);
  }
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// Python's str.strip(chars): removes any of the given code points from both ends.
std::string strip_chars(std::string_view s, std::string_view chars) {
  const auto set = code_points(chars);
  auto is_strip = [&](std::string_view cp) { return std::find(set.begin(), set.end(), cp) != set.end(); };
  auto cps = code_points(s);
  std::size_t b = 0, e = cps.size();
  while (b < e && is_strip(cps[b])) ++b;
  while (e > b && is_strip(cps[e - 1])) --e;
  std::string out;
  for (std::size_t i = b; i < e; ++i) out.append(cps[i]);
  return out;
}

fallible<value> number_from_double(double d, bool as_int) {
  if (as_int) {
    if (std::isfinite(d) && std::fabs(d) < 9.2e18) return value::integer(static_cast<std::int64_t>(d));
  }
  return value::floating(d);
}

}  // namespace

fallible<int> evaluator::compare(const value& a, const value& b, bool case_sensitive) {
  if (a.is_none() && b.is_none()) return 0;
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_none() || b.is_none() || a.is_undefined() || b.is_undefined())
    return troupe::unexpected(type_error("cannot compare " + kind_name(a) + " with " + kind_name(b)));
  const auto numeric = [](const value& v) { return v.is_int() || v.is_float() || v.is_bool(); };
  if (numeric(a) && numeric(b)) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
    const double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    if (case_sensitive) return utf16_compare(a.as_string(), b.as_string());
    return utf16_compare(js_lower(a.as_string()), js_lower(b.as_string()));
  }
  return troupe::unexpected(type_error("cannot compare " + kind_name(a) + " with " + kind_name(b)));
}

fallible<bool> evaluator::test(std::string_view n, const value& v, std::span<const value> args) {
  const value arg = args.empty() ? value() : args[0];
  if (n == "boolean") return v.is_bool();
  if (n == "callable") return v.is_callable();
  if (n == "odd" || n == "even") {
    if (!v.is_int()) return troupe::unexpected(type_error("cannot test whether " + kind_name(v) + " is " + std::string(n)));
    return (v.as_int() % 2 != 0) == (n == "odd");
  }
  if (n == "false") return v.is_bool() && !v.as_bool();
  if (n == "true") return v.is_bool() && v.as_bool();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "number") return v.is_number();
  if (n == "integer") return v.is_int();
  if (n == "float") return v.is_float();
  // The reference counts strings and lists (not tuples) as iterable; maps are not.
  if (n == "iterable") return (v.is_list() && !v.as_list().tuple) || v.is_string();
  if (n == "mapping") return v.is_map();
  if (n == "sequence") return v.is_list() || v.is_map() || v.is_string();
  if (n == "lower") return v.is_string() && v.as_string() == js_lower(v.as_string());
  if (n == "upper") return v.is_string() && v.as_string() == js_upper(v.as_string());
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "equalto" || n == "eq" || n == "==") return strict_equals(v, arg);
  if (n == "ne" || n == "!=") return !strict_equals(v, arg);
  if (n == "sameas") return strict_equals(v, arg);
  if (n == "divisibleby") {
    if (!v.is_number() || !arg.is_number())
      return troupe::unexpected(type_error("divisibleby takes numbers"));
    if (v.is_int() && arg.is_int()) return arg.as_int() != 0 && v.as_int() % arg.as_int() == 0;
    return arg.as_number() != 0 && std::fmod(v.as_number(), arg.as_number()) == 0;
  }
  if (n == "in") {
    TROUPE_JINJA_TRY(r, binary("in", v, arg));
    return r.as_bool();
  }
  if (n == "lt" || n == "<" || n == "le" || n == "<=" || n == "gt" || n == ">" || n == "ge" || n == ">=") {
    const std::string op = n == "lt" ? "<" : n == "le" ? "<=" : n == "gt" ? ">" : n == "ge" ? ">=" : std::string(n);
    TROUPE_JINJA_TRY(r, binary(op, v, arg));
    return r.truthy();
  }
  return troupe::unexpected(error(template_error_code::unknown_test, "unknown test '" + std::string(n) + "'"));
}

fallible<value> evaluator::filter(std::string_view n, const value& v, call_args args, bool called, const env_ptr& env) {
  if (!known(known_filters, n))
    return troupe::unexpected(error(template_error_code::unknown_filter, "unknown filter '" + std::string(n) + "'"));
  auto refuse = [&]() -> fallible<value> {
    return troupe::unexpected(type_error("cannot apply filter '" + std::string(n) + "' to " + kind_name(v)));
  };

  if (n == "safe") return v;
  if (n == "tojson") {
    json_options o;
    const value indent = argument(args, 99, "indent", value::none());
    if (!indent.is_int() && !indent.is_none()) return troupe::unexpected(type_error("tojson: indent must be an integer"));
    if (indent.is_int() && indent.as_int() < 0) return troupe::unexpected(type_error("tojson: indent must not be negative"));
    o.indent = indent.is_int() ? static_cast<int>(std::min<std::int64_t>(indent.as_int(), 1 << 16)) : 0;
    const value ascii = argument(args, 99, "ensure_ascii", value::boolean(false));
    const value sort = argument(args, 99, "sort_keys", value::boolean(false));
    if (!ascii.is_bool() || !sort.is_bool())
      return troupe::unexpected(type_error("tojson: ensure_ascii and sort_keys must be booleans"));
    o.ensure_ascii = ascii.as_bool();
    o.sort_keys = sort.as_bool();
    const value seps = argument(args, 99, "separators", value::none());
    if (seps.is_list()) {
      const auto& s = seps.as_list().items;
      if (s.size() != 2 || !s[0].is_string() || !s[1].is_string())
        return troupe::unexpected(type_error("tojson: separators must be two strings"));
      o.has_separators = true;
      o.item_separator = s[0].as_string();
      o.key_separator = s[1].as_string();
    } else if (!seps.is_none()) {
      return troupe::unexpected(type_error("tojson: separators must be two strings"));
    }
    TROUPE_JINJA_TRY(text, json(v, o));
    return make_string(std::move(text));
  }
  if (n == "default" || n == "d") {
    const value fallback = args.positional.empty() ? value::string("") : args.positional[0];
    const value boolean = argument(args, 1, "boolean", value::boolean(false));
    if (!boolean.is_bool()) return troupe::unexpected(type_error("default: the boolean flag must be a boolean"));
    if (v.is_undefined() || (boolean.as_bool() && !v.truthy())) return fallback;
    return v;
  }
  if ((n == "int" || n == "float") && called) {
    // The called forms keep numbers as they are ({{ 3.7 | int() }} is 3.7 in the reference).
    const bool as_int = n == "int";
    const value fallback = argument(args, 0, "default", as_int ? value::integer(0) : value::floating(0.0));
    if (v.is_string()) {
      auto d = as_int ? js_parse_int(v.as_string()) : js_parse_float(v.as_string());
      if (!d) return fallback;
      return number_from_double(*d, as_int);
    }
    if (v.is_number()) return v;
    if (v.is_bool()) return as_int ? value::integer(v.as_bool()) : value::floating(v.as_bool() ? 1.0 : 0.0);
    return refuse();
  }
  if (n == "escape" || n == "e") {
    TROUPE_JINJA_TRY(text, display(v));
    return make_string(html_escape(text));
  }

  if (v.is_list()) {
    const auto& items = v.as_list().items;
    if (n == "list") return v;
    if (n == "first") return items.empty() ? value() : items.front();
    if (n == "last") return items.empty() ? value() : items.back();
    if (n == "length" || n == "count") return value::integer(static_cast<std::int64_t>(items.size()));
    if (n == "reverse") return make_list(std::vector<value>(items.rbegin(), items.rend()));
    if (n == "string") {
      json_options o;
      o.undefined_as_null = false;
      TROUPE_JINJA_TRY(text, json(v, o));
      return make_string(std::move(text));
    }
    if (n == "join") {
      const value sep = argument(args, 0, "separator", value::string(""));
      if (!sep.is_string()) return troupe::unexpected(type_error("join: the separator must be a string"));
      std::string out;
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += sep.as_string();
        // Array#join writes none and undefined as nothing.
        if (items[i].is_none() || items[i].is_undefined()) continue;
        TROUPE_JINJA_TRY(part, raw(items[i]));
        out += part;
        if (out.size() > settings_.limits.max_output_bytes) break;
      }
      return make_string(std::move(out));
    }
    if (n == "unique") {
      std::unordered_set<std::string> seen;
      std::vector<value> out;
      for (const auto& item : items)
        if (seen.insert(same_value_key(item)).second) out.push_back(item);
      return make_list(std::move(out));
    }
    if (n == "sort") {
      const value reverse = argument(args, 0, "reverse", value::boolean(false));
      const value case_sensitive = argument(args, 1, "case_sensitive", value::boolean(false));
      const value attribute = argument(args, 2, "attribute", value::none());
      if (!reverse.is_bool() || !case_sensitive.is_bool())
        return troupe::unexpected(type_error("sort: reverse and case_sensitive must be booleans"));
      if (!attribute.is_string() && !attribute.is_int() && !attribute.is_none())
        return troupe::unexpected(type_error("sort: attribute must be a string, an integer or none"));
      const std::string path = attribute.is_int() ? std::to_string(attribute.as_int())
                               : attribute.is_string() ? attribute.as_string() : std::string();
      auto key = [&](const value& item) { return attribute.is_none() ? item : attribute_path(item, path); };
      std::vector<value> out = items;
      std::optional<template_error> failure;
      std::stable_sort(out.begin(), out.end(), [&](const value& a, const value& b) {
        if (failure) return false;
        auto c = compare(key(a), key(b), case_sensitive.as_bool());
        if (!c) {
          failure = std::move(c.error());
          return false;
        }
        return (reverse.as_bool() ? -*c : *c) < 0;
      });
      if (failure) return troupe::unexpected(std::move(*failure));
      return make_list(std::move(out));
    }
    if (n == "selectattr" || n == "rejectattr" || n == "select" || n == "reject") {
      const bool by_attr = n == "selectattr" || n == "rejectattr";
      const bool keep_matches = n == "selectattr" || n == "select";
      if (by_attr && (args.positional.empty() || !args.positional[0].is_string()))
        return troupe::unexpected(type_error(std::string(n) + ": the attribute must be a string"));
      const std::size_t test_at = by_attr ? 1 : 0;
      std::optional<std::string> test_name;
      if (args.positional.size() > test_at) {
        if (!args.positional[test_at].is_string())
          return troupe::unexpected(type_error(std::string(n) + ": the test name must be a string"));
        test_name = args.positional[test_at].as_string();
      }
      const std::span<const value> test_args =
          std::span<const value>(args.positional).subspan(std::min(args.positional.size(), test_at + 1));
      std::vector<value> out;
      for (const auto& item : items) {
        value subject = item;
        bool ok = false;
        if (by_attr) {
          if (!item.is_attribute_container())
            return troupe::unexpected(type_error(std::string(n) + " takes a list of maps"));
          // The reference reads the plain key, and a missing one never matches.
          const value* found = item.as_map().entries.find(args.positional[0].as_string());
          if (found == nullptr) {
            if (!keep_matches) out.push_back(item);
            continue;
          }
          subject = *found;
        }
        if (test_name) {
          TROUPE_JINJA_TRY(r, test(*test_name, subject, test_args));
          ok = r;
        } else {
          ok = subject.truthy();
        }
        if (ok == keep_matches) out.push_back(item);
      }
      return make_list(std::move(out));
    }
    if (n == "map") {
      std::vector<value> out;
      if (const value* attr = args.keyword.find("attribute")) {
        if (!attr->is_string()) return troupe::unexpected(type_error("map: attribute must be a string"));
        const value* fallback = args.keyword.find("default");
        for (const auto& item : items) {
          if (!item.is_attribute_container()) return troupe::unexpected(type_error("map: the items must be maps"));
          value found = attribute_path(item, attr->as_string());
          out.push_back(found.is_undefined() && fallback ? *fallback : found);
        }
        return make_list(std::move(out));
      }
      // map('filter', args...): Jinja applies a filter to each item; the reference refuses.
      if (args.positional.empty() || !args.positional[0].is_string())
        return troupe::unexpected(type_error("map takes attribute= or a filter name"));
      const std::string filter_name = args.positional[0].as_string();
      call_args rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keyword = args.keyword;
      for (const auto& item : items) {
        TROUPE_JINJA_TRY(r, filter(filter_name, item, rest, !rest.positional.empty(), env));
        out.push_back(std::move(r));
      }
      return make_list(std::move(out));
    }
    if (n == "int" || n == "float" || n == "bool") return refuse();
    return refuse();
  }

  if (v.is_string()) {
    const std::string& s = v.as_string();
    if (n == "length" || n == "count") return value::integer(static_cast<std::int64_t>(utf16_length(s)));
    if (n == "upper") return make_string(js_upper(s));
    if (n == "lower") return make_string(js_lower(s));
    if (n == "title") return make_string(js_title(s));
    if (n == "capitalize") return make_string(js_capitalize(s));
    if (n == "trim") {
      if (!args.positional.empty() && args.positional[0].is_string())
        return make_string(strip_chars(s, args.positional[0].as_string()));
      return make_string(std::string(js_trim(s)));
    }
    if (n == "string") return v;
    if (n == "join") {
      if (!called) return v;
      const value sep = argument(args, 0, "separator", value::string(""));
      if (!sep.is_string()) return troupe::unexpected(type_error("join: the separator must be a string"));
      std::string out;
      const auto cps = code_points(s);
      for (std::size_t i = 0; i < cps.size(); ++i) {
        if (i > 0) out += sep.as_string();
        out.append(cps[i]);
        if (out.size() > settings_.limits.max_output_bytes) break;
      }
      return make_string(std::move(out));
    }
    if (n == "int") {
      auto d = js_parse_int(s);
      return d ? number_from_double(*d, true) : fallible<value>(value::integer(0));
    }
    if (n == "float") {
      auto d = js_parse_float(s);
      return value::floating(d ? *d : 0.0);
    }
    if (n == "indent") {
      const value width = argument(args, 0, "width", value::integer(4));
      const value first = argument(args, 1, "first", value::boolean(false));
      const value blank = argument(args, 2, "blank", value::boolean(false));
      std::string pad;
      if (width.is_int()) {
        if (width.as_int() < 0 || static_cast<std::uint64_t>(width.as_int()) > settings_.limits.max_output_bytes)
          return troupe::unexpected(type_error("indent: the width is out of range"));
        pad.assign(static_cast<std::size_t>(width.as_int()), ' ');
      } else if (width.is_string()) {
        pad = width.as_string();
      } else {
        return troupe::unexpected(type_error("indent: the width must be an integer"));
      }
      std::string out;
      std::size_t start = 0;
      for (std::size_t line = 0;; ++line) {
        const std::size_t end = s.find('\n', start);
        const std::string_view text = std::string_view(s).substr(start, end == std::string::npos ? std::string::npos : end - start);
        const bool skip = (!first.truthy() && line == 0) || (!blank.truthy() && text.empty());
        if (!skip) out += pad;
        out += text;
        if (out.size() > settings_.limits.max_output_bytes) break;
        if (end == std::string::npos) break;
        out += '\n';
        start = end + 1;
      }
      return make_string(std::move(out));
    }
    if (n == "replace") {
      TROUPE_JINJA_TRY(fn, member(v, value::string("replace")));
      return call(fn, std::move(args), env, node{});
    }
    if (n == "first" || n == "last") {
      const auto cps = code_points(s);
      if (cps.empty()) return value();
      return value::string(std::string(n == "first" ? cps.front() : cps.back()));
    }
    if (n == "reverse" || n == "list") {
      auto cps = code_points(s);
      if (n == "reverse") {
        std::reverse(cps.begin(), cps.end());
        std::string out;
        for (auto cp : cps) out.append(cp);
        return value::string(std::move(out));
      }
      std::vector<value> out;
      for (auto cp : cps) out.push_back(value::string(std::string(cp)));
      return make_list(std::move(out));
    }
    if (n == "wordcount") {
      std::int64_t words = 0;
      bool in_word = false;
      for (std::size_t i = 0; i < s.size();) {
        const char32_t cp = next_code_point(s, i);
        const bool word = cp < 0x80 ? is_ascii_word(static_cast<char>(cp)) : !is_js_space(cp);
        if (word && !in_word) ++words;
        in_word = word;
      }
      return value::integer(words);
    }
    return refuse();
  }

  if (v.is_number()) {
    if (n == "abs") {
      if (v.is_int()) return v.as_int() < 0 ? unary("-", v) : fallible<value>(v);
      return value::floating(std::fabs(v.as_float()));
    }
    if (n == "int") return number_from_double(std::floor(v.as_number()), true);
    if (n == "float") return value::floating(v.as_number());
    if (n == "string") return make_string(v.is_int() ? js_integer(v.as_int()) : js_float(v.as_float()));
    if (n == "round") {
      const value precision = argument(args, 0, "precision", value::integer(0));
      const value method = argument(args, 1, "method", value::string("common"));
      if (!precision.is_int() || !method.is_string())
        return troupe::unexpected(type_error("round: precision must be an integer and method a string"));
      const double scale = std::pow(10.0, static_cast<double>(precision.as_int()));
      const double x = v.as_number() * scale;
      const std::string& m = method.as_string();
      double r = 0;
      if (m == "common") r = std::nearbyint(x);
      else if (m == "ceil") r = std::ceil(x);
      else if (m == "floor") r = std::floor(x);
      else return troupe::unexpected(type_error("round: method must be common, ceil or floor"));
      return value::floating(r / scale);
    }
    return refuse();
  }

  if (v.is_map()) {
    if (n == "items" || n == "keys" || n == "values" || n == "dictsort" || n == "get") {
      TROUPE_JINJA_TRY(fn, member(v, value::string(std::string(n))));
      if (fn.is_callable()) return call(fn, std::move(args), env, node{});
      return refuse();
    }
    if (n == "length" || n == "count") return value::integer(static_cast<std::int64_t>(v.as_map().entries.size()));
    if (n == "list") {
      std::vector<value> keys;
      for (const auto& [k, item] : v.as_map().entries) keys.push_back(value::string(k));
      return make_list(std::move(keys));
    }
    return refuse();
  }

  if (v.is_bool()) {
    if (n == "bool") return v;
    if (n == "int") return value::integer(v.as_bool() ? 1 : 0);
    if (n == "float") return value::floating(v.as_bool() ? 1.0 : 0.0);
    if (n == "string") return value::string(v.as_bool() ? "true" : "false");
    return refuse();
  }
  return refuse();
}

}  // namespace troupe::text::jinja

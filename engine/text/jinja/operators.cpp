// Operators, member access, slicing and the methods of strings and maps, as the reference evaluates
// them (see the notes at each for where that differs from Python's Jinja).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "engine/text/jinja/detail/evaluator.hpp"
#include "engine/text/jinja/detail/js_text.hpp"

namespace troupe::text::jinja {
namespace {

using namespace detail;

std::string kind_name(const value& v) { return a_kind(v.kind()); }

bool numeric_like(const value& v) { return v.is_int() || v.is_float() || v.is_bool(); }

// An integral double back to an integer value where it fits, as the reference keeps integers integers.
value integral(double d) {
  if (std::isfinite(d) && std::fabs(d) < 9.2e18) return value::integer(static_cast<std::int64_t>(d));
  return value::floating(d);
}

fallible<value> arithmetic(std::string_view op, const value& l, const value& r, bool& handled) {
  handled = true;
  const bool floats = l.is_float() || r.is_float();
  if (!floats) {
    const std::int64_t a = l.as_int(), b = r.as_int();
    std::int64_t out = 0;
    if (op == "+") return __builtin_add_overflow(a, b, &out) ? value::floating(double(a) + double(b)) : value::integer(out);
    if (op == "-") return __builtin_sub_overflow(a, b, &out) ? value::floating(double(a) - double(b)) : value::integer(out);
    if (op == "*") return __builtin_mul_overflow(a, b, &out) ? value::floating(double(a) * double(b)) : value::integer(out);
    if (op == "//") {
      // Math.floor(a / b): Infinity or NaN for a zero divisor, which print as such.
      if (b == 0) return value::floating(std::floor(double(a) / double(b)));
      if (a == std::numeric_limits<std::int64_t>::min() && b == -1) return value::floating(-double(a));
      std::int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
      return value::integer(q);
    }
    if (op == "%") {
      // JavaScript's remainder takes the sign of the dividend (-7 % 3 is -1), unlike Python's.
      if (b == 0) return value::floating(std::nan(""));
      if (b == -1) return value::integer(0);
      return value::integer(a % b);
    }
    if (op == "<") return value::boolean(a < b);
    if (op == ">") return value::boolean(a > b);
    if (op == "<=") return value::boolean(a <= b);
    if (op == ">=") return value::boolean(a >= b);
  }
  const double a = l.as_number(), b = r.as_number();
  if (op == "+") return value::floating(a + b);
  if (op == "-") return value::floating(a - b);
  if (op == "*") return value::floating(a * b);
  if (op == "//") return value::floating(std::floor(a / b));
  if (op == "%") return value::floating(std::fmod(a, b));
  if (op == "<") return value::boolean(a < b);
  if (op == ">") return value::boolean(a > b);
  if (op == "<=") return value::boolean(a <= b);
  if (op == ">=") return value::boolean(a >= b);
  if (op == "/") return value::floating(a / b);
  handled = false;
  return value();
}

bool contains_strict(const value& list, const value& needle) {
  const auto& items = list.as_list().items;
  return std::any_of(items.begin(), items.end(), [&](const value& x) { return strict_equals(x, needle); });
}

std::shared_ptr<callable_data> method(std::string name,
                                      std::function<fallible<value>(call_context&, call_args)> fn) {
  auto c = std::make_shared<callable_data>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return c;
}

// Python's str.split as the reference implements it (whitespace runs without a separator).
fallible<value> split_string(evaluator& ev, const std::string& s, const value& sep, const value& maxsplit_v) {
  if (!sep.is_string() && !sep.is_none())
    return troupe::unexpected(ev.type_error("split: the separator must be a string or none"));
  if (!maxsplit_v.is_int()) return troupe::unexpected(ev.type_error("split: maxsplit must be an integer"));
  const std::int64_t maxsplit = maxsplit_v.as_int();
  std::vector<value> parts;
  if (sep.is_none()) {
    const std::string_view text = js_trim_start(s);
    std::size_t i = 0;
    while (i < text.size()) {
      while (std::size_t n = js_space_at(text, i)) i += n;
      if (i >= text.size()) break;
      std::size_t j = i;
      while (j < text.size() && js_space_at(text, j) == 0) next_code_point(text, j);
      if (maxsplit != -1 && static_cast<std::int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(value::string(std::string(text.substr(i))));
        break;
      }
      parts.push_back(value::string(std::string(text.substr(i, j - i))));
      i = j;
    }
    return ev.make_list(std::move(parts));
  }
  const std::string& d = sep.as_string();
  if (d.empty()) return troupe::unexpected(ev.type_error("split: empty separator"));
  std::vector<std::string> pieces;
  for (std::size_t start = 0;;) {
    const std::size_t at = s.find(d, start);
    if (at == std::string::npos) {
      pieces.push_back(s.substr(start));
      break;
    }
    pieces.push_back(s.substr(start, at - start));
    start = at + d.size();
    if (pieces.size() > ev.settings().limits.max_loop_iterations) break;
  }
  const auto count = static_cast<std::int64_t>(pieces.size());
  if (maxsplit != -1 && count > maxsplit) {
    // result.push(result.splice(maxsplit).join(sep)), negative maxsplit counting from the end.
    const std::int64_t from = maxsplit < 0 ? std::max<std::int64_t>(count + maxsplit, 0) : maxsplit;
    std::string rest;
    for (std::int64_t i = from; i < count; ++i) {
      if (i > from) rest += d;
      rest += pieces[static_cast<std::size_t>(i)];
    }
    pieces.resize(static_cast<std::size_t>(from));
    pieces.push_back(std::move(rest));
  }
  for (auto& p : pieces) parts.push_back(value::string(std::move(p)));
  return ev.make_list(std::move(parts));
}

// str.replace(old, new, count) with the reference's rules: an empty `old` matches between code points.
fallible<value> replace_string(evaluator& ev, const std::string& s, const call_args& args) {
  if (args.positional.size() < 2) return troupe::unexpected(ev.type_error("replace() takes at least two arguments"));
  const value& from = args.positional[0];
  const value& to = args.positional[1];
  if (!from.is_string() || !to.is_string()) return troupe::unexpected(ev.type_error("replace() arguments must be strings"));
  value count = value::none();
  if (args.positional.size() > 2) count = args.positional[2];
  else if (const value* c = args.keyword.find("count")) count = *c;
  if (!count.is_int() && !count.is_none())
    return troupe::unexpected(ev.type_error("replace() count must be an integer or none"));
  if (count.is_int() && count.as_int() == 0) return value::string(s);
  std::int64_t remaining =
      count.is_none() || count.as_int() < 0 ? std::numeric_limits<std::int64_t>::max() : count.as_int();
  const std::string& old_text = from.as_string();
  const std::string& new_text = to.as_string();
  std::string out;
  if (old_text.empty()) {
    std::size_t i = 0;
    while (true) {
      if (remaining > 0) {
        out += new_text;
        --remaining;
      }
      if (out.size() > ev.settings().limits.max_output_bytes) break;
      if (i >= s.size()) break;
      const std::size_t start = i;
      next_code_point(s, i);
      out.append(s, start, i - start);
    }
    return ev.make_string(std::move(out));
  }
  std::size_t start = 0;
  while (remaining > 0) {
    const std::size_t at = s.find(old_text, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += new_text;
    start = at + old_text.size();
    --remaining;
    if (out.size() > ev.settings().limits.max_output_bytes) break;
  }
  out.append(s, start, std::string::npos);
  return ev.make_string(std::move(out));
}

fallible<value> starts_or_ends(evaluator& ev, const std::string& s, const call_args& args, bool starts) {
  const char* label = starts ? "startswith()" : "endswith()";
  if (args.positional.empty()) return troupe::unexpected(ev.type_error(std::string(label) + " takes an argument"));
  auto matches = [&](const std::string& p) { return starts ? s.starts_with(p) : s.ends_with(p); };
  const value& p = args.positional[0];
  if (p.is_string()) return value::boolean(matches(p.as_string()));
  if (p.is_list()) {
    for (const auto& item : p.as_list().items) {
      if (!item.is_string()) return troupe::unexpected(ev.type_error(std::string(label) + " takes strings"));
      if (matches(item.as_string())) return value::boolean(true);
    }
    return value::boolean(false);
  }
  return troupe::unexpected(ev.type_error(std::string(label) + " takes a string or a tuple of strings"));
}

// Python's str.count and str.find (troupe's additions; the reference has neither). Positions count
// code points, as Python's do.
fallible<value> count_or_find(evaluator& ev, const std::string& s, const call_args& args, bool find) {
  if (args.positional.empty() || !args.positional[0].is_string())
    return troupe::unexpected(ev.type_error(std::string(find ? "find()" : "count()") + " takes a string"));
  const std::string& sub = args.positional[0].as_string();
  if (find) {
    const std::size_t at = s.find(sub);
    if (at == std::string::npos) return value::integer(-1);
    return value::integer(static_cast<std::int64_t>(code_points(std::string_view(s).substr(0, at)).size()));
  }
  if (sub.empty()) return value::integer(static_cast<std::int64_t>(code_points(s).size() + 1));
  std::int64_t n = 0;
  for (std::size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return value::integer(n);
}

fallible<value> string_method(const value& receiver, const std::string& prop) {
  const std::string& s = receiver.as_string();
  auto simple = [&](std::function<std::string(const std::string&)> f) -> fallible<value> {
    return value::function(method(prop, [receiver, f](call_context& ctx, call_args) -> fallible<value> {
      return ctx.ev().make_string(f(receiver.as_string()));
    }));
  };
  if (prop == "length") return value::integer(static_cast<std::int64_t>(utf16_length(s)));
  // The reference ignores arguments to strip, lstrip and rstrip: s.strip('\n') strips all whitespace.
  if (prop == "upper") return simple([](const std::string& x) { return js_upper(x); });
  if (prop == "lower") return simple([](const std::string& x) { return js_lower(x); });
  if (prop == "strip") return simple([](const std::string& x) { return std::string(js_trim(x)); });
  if (prop == "lstrip") return simple([](const std::string& x) { return std::string(js_trim_start(x)); });
  if (prop == "rstrip") return simple([](const std::string& x) { return std::string(js_trim_end(x)); });
  if (prop == "title") return simple([](const std::string& x) { return js_title(x); });
  if (prop == "capitalize") return simple([](const std::string& x) { return js_capitalize(x); });
  if (prop == "startswith" || prop == "endswith") {
    const bool starts = prop == "startswith";
    return value::function(method(prop, [receiver, starts](call_context& ctx, call_args args) {
      return starts_or_ends(ctx.ev(), receiver.as_string(), args, starts);
    }));
  }
  if (prop == "split") {
    return value::function(method(prop, [receiver](call_context& ctx, call_args args) {
      value sep = args.positional.size() > 0 ? args.positional[0] : value::none();
      value maxsplit = args.positional.size() > 1 ? args.positional[1] : value::integer(-1);
      if (const value* k = args.keyword.find("sep")) sep = *k;
      if (const value* k = args.keyword.find("maxsplit")) maxsplit = *k;
      return split_string(ctx.ev(), receiver.as_string(), sep, maxsplit);
    }));
  }
  if (prop == "replace") {
    return value::function(method(prop, [receiver](call_context& ctx, call_args args) {
      return replace_string(ctx.ev(), receiver.as_string(), args);
    }));
  }
  if (prop == "count" || prop == "find") {
    const bool find = prop == "find";
    return value::function(method(prop, [receiver, find](call_context& ctx, call_args args) {
      return count_or_find(ctx.ev(), receiver.as_string(), args, find);
    }));
  }
  if (prop == "join") {
    return value::function(method(prop, [receiver](call_context& ctx, call_args args) -> fallible<value> {
      if (args.positional.empty() || !args.positional[0].is_list())
        return troupe::unexpected(ctx.ev().type_error("join() takes a list of strings"));
      std::string out;
      bool first = true;
      for (const auto& item : args.positional[0].as_list().items) {
        if (!item.is_string()) return troupe::unexpected(ctx.ev().type_error("join() takes a list of strings"));
        if (!first) out += receiver.as_string();
        first = false;
        out += item.as_string();
        if (out.size() > ctx.ev().settings().limits.max_output_bytes) break;
      }
      return ctx.ev().make_string(std::move(out));
    }));
  }
  return value();
}

fallible<value> dictsort(evaluator& ev, const value& receiver, const call_args& args) {
  auto arg = [&](std::size_t i, const char* key, value fallback) {
    if (i < args.positional.size()) return args.positional[i];
    if (const value* v = args.keyword.find(key)) return *v;
    return fallback;
  };
  const value case_sensitive = arg(0, "case_sensitive", value::boolean(false));
  const value by = arg(1, "by", value::string("key"));
  const value reverse = arg(2, "reverse", value::boolean(false));
  if (!case_sensitive.is_bool()) return troupe::unexpected(ev.type_error("dictsort: case_sensitive must be a boolean"));
  if (!by.is_string() || (by.as_string() != "key" && by.as_string() != "value"))
    return troupe::unexpected(ev.type_error("dictsort: by must be 'key' or 'value'"));
  if (!reverse.is_bool()) return troupe::unexpected(ev.type_error("dictsort: reverse must be a boolean"));
  std::vector<std::pair<value, value>> items;
  for (const auto& [k, v] : receiver.as_map().entries) items.emplace_back(value::string(k), v);
  const bool by_key = by.as_string() == "key";
  std::optional<template_error> failure;
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
    if (failure) return false;
    auto c = ev.compare(by_key ? a.first : a.second, by_key ? b.first : b.second, case_sensitive.as_bool());
    if (!c) {
      failure = std::move(c.error());
      return false;
    }
    return (reverse.as_bool() ? -*c : *c) < 0;
  });
  if (failure) return troupe::unexpected(std::move(*failure));
  std::vector<value> out;
  for (auto& [k, v] : items) {
    TROUPE_JINJA_TRY(pair, ev.make_list({std::move(k), std::move(v)}));
    out.push_back(std::move(pair));
  }
  return ev.make_list(std::move(out));
}

fallible<value> map_method(const value& receiver, const std::string& prop) {
  if (prop == "get") {
    return value::function(method(prop, [receiver](call_context& ctx, call_args args) -> fallible<value> {
      if (args.positional.empty() || !args.positional[0].is_string())
        return troupe::unexpected(ctx.ev().type_error("get(): the key must be a string"));
      if (const value* v = receiver.as_map().entries.find(args.positional[0].as_string())) return *v;
      if (args.positional.size() > 1) return args.positional[1];
      if (const value* d = args.keyword.find("default")) return *d;
      return value::none();
    }));
  }
  if (prop == "items" || prop == "keys" || prop == "values") {
    return value::function(method(prop, [receiver, prop](call_context& ctx, call_args) -> fallible<value> {
      std::vector<value> out;
      for (const auto& [k, v] : receiver.as_map().entries) {
        if (prop == "keys") {
          out.push_back(value::string(k));
        } else if (prop == "values") {
          out.push_back(v);
        } else {
          TROUPE_JINJA_TRY(pair, ctx.ev().make_list({value::string(k), v}));
          out.push_back(std::move(pair));
        }
      }
      return ctx.ev().make_list(std::move(out));
    }));
  }
  if (prop == "dictsort") {
    return value::function(method(prop, [receiver](call_context& ctx, call_args args) {
      return dictsort(ctx.ev(), receiver, args);
    }));
  }
  return value();
}

}  // namespace

fallible<value> evaluator::binary(std::string_view op, const value& l, const value& r) {
  if (op == "==") return value::boolean(loose_equals(l, r));
  if (op == "!=") return value::boolean(!loose_equals(l, r));
  const bool membership = op == "in" || op == "not in";
  if (l.is_undefined() || r.is_undefined()) {
    // `x in undefined` is false (and `not in` true); every other operation on undefined fails.
    if (r.is_undefined() && membership) return value::boolean(op == "not in");
    return troupe::unexpected(type_error("cannot apply '" + std::string(op) + "' to an undefined value"));
  }
  if (l.is_none() || r.is_none())
    return troupe::unexpected(type_error("cannot apply '" + std::string(op) + "' to none"));
  if (op == "~") {
    TROUPE_JINJA_TRY(a, raw(l));
    TROUPE_JINJA_TRY(b, raw(r));
    return make_string(a + b);
  }
  if (op == "**" && numeric_like(l) && numeric_like(r)) {
    const double a = l.as_number(), b = r.as_number();
    if (a == 0 && b < 0) return troupe::unexpected(type_error("0.0 cannot be raised to a negative power"));
    const double p = std::pow(a, b);
    if (!std::isfinite(p)) return troupe::unexpected(type_error("the power is not a finite real number"));
    if (l.is_float() || r.is_float() || b < 0) return value::floating(p);
    return integral(p);
  }
  if (l.is_number() && r.is_number()) {
    bool handled = false;
    auto v = arithmetic(op, l, r, handled);
    if (handled) return v;
  } else if (l.is_list() && r.is_list()) {
    if (op == "+") {
      std::vector<value> items = l.as_list().items;
      items.insert(items.end(), r.as_list().items.begin(), r.as_list().items.end());
      return make_list(std::move(items));
    }
  } else if (r.is_list() && membership) {
    const bool found = contains_strict(r, l);
    return value::boolean(op == "in" ? found : !found);
  }
  if ((l.is_string() || r.is_string()) && op == "+") {
    TROUPE_JINJA_TRY(a, raw(l));
    TROUPE_JINJA_TRY(b, raw(r));
    return make_string(a + b);
  }
  if (l.is_string() && r.is_string()) {
    if (membership) {
      const bool found = r.as_string().find(l.as_string()) != std::string::npos;
      return value::boolean(op == "in" ? found : !found);
    }
    // Jinja compares strings; the reference refuses. Code unit order, as JavaScript would.
    const int c = utf16_compare(l.as_string(), r.as_string());
    if (op == "<") return value::boolean(c < 0);
    if (op == ">") return value::boolean(c > 0);
    if (op == "<=") return value::boolean(c <= 0);
    if (op == ">=") return value::boolean(c >= 0);
  }
  if (l.is_string() && r.is_map() && membership) {
    const bool found = r.as_map().entries.find(l.as_string()) != nullptr;
    return value::boolean(op == "in" ? found : !found);
  }
  if (op == "*" && ((l.is_string() && r.is_int()) || (l.is_int() && r.is_string()))) {
    // Jinja's "-" * 3; the reference refuses.
    const std::string& s = l.is_string() ? l.as_string() : r.as_string();
    const std::int64_t n = l.is_int() ? l.as_int() : r.as_int();
    if (n > 0 && s.size() * static_cast<std::uint64_t>(n) > settings_.limits.max_output_bytes)
      return troupe::unexpected(error(template_error_code::output_limit, "a repeated string is longer than the output limit"));
    std::string out;
    for (std::int64_t i = 0; i < n; ++i) out += s;
    return make_string(std::move(out));
  }
  return troupe::unexpected(
      type_error("unknown operator '" + std::string(op) + "' between " + kind_name(l) + " and " + kind_name(r)));
}

fallible<value> evaluator::unary(std::string_view op, const value& v) {
  if (op == "not") return value::boolean(!v.truthy());
  const bool negate = op == "-";
  if (v.is_int()) {
    if (negate && v.as_int() == std::numeric_limits<std::int64_t>::min()) return value::floating(-double(v.as_int()));
    return value::integer(negate ? -v.as_int() : v.as_int());
  }
  if (v.is_bool()) return value::integer(negate ? -std::int64_t(v.as_bool()) : std::int64_t(v.as_bool()));
  if (v.is_float()) return value::floating(negate ? -v.as_float() : v.as_float());
  return troupe::unexpected(type_error("unknown operator '" + std::string(op) + "' for " + kind_name(v)));
}

fallible<value> evaluator::member(const value& object, const value& property) {
  if (object.is_attribute_container()) {
    if (!property.is_string())
      return troupe::unexpected(type_error("cannot look up " + kind_name(property) + " in " + kind_name(object)));
    if (const value* v = object.as_map().entries.find(property.as_string())) return *v;
    if (object.is_map()) return map_method(object, property.as_string());
    return value();
  }
  if (object.is_list() || object.is_string()) {
    if (property.is_int()) {
      if (object.is_string()) {
        auto unit = utf16_at(object.as_string(), property.as_int());
        return unit ? value::string(std::move(*unit)) : value();
      }
      const auto& items = object.as_list().items;
      std::int64_t i = property.as_int();
      const auto size = static_cast<std::int64_t>(items.size());
      if (i < 0) i += size;
      if (i < 0 || i >= size) return value();
      return items[static_cast<std::size_t>(i)];
    }
    if (!property.is_string())
      return troupe::unexpected(type_error("cannot index " + kind_name(object) + " with " + kind_name(property)));
    if (object.is_list()) {
      if (property.as_string() == "length") return value::integer(static_cast<std::int64_t>(object.as_list().items.size()));
      return value();
    }
    return string_method(object, property.as_string());
  }
  if (!property.is_string())
    return troupe::unexpected(type_error("cannot index " + kind_name(object) + " with " + kind_name(property)));
  return value();
}

fallible<value> evaluator::slice(const value& object, const value& start_v, const value& stop_v, const value& step_v) {
  if (!object.is_list() && !object.is_string())
    return troupe::unexpected(type_error("cannot slice " + kind_name(object)));
  for (const value* p : {&start_v, &stop_v, &step_v})
    if (!p->is_int() && !p->is_undefined())
      return troupe::unexpected(type_error("slice bounds must be integers, not " + kind_name(*p)));
  std::vector<std::string_view> chars;
  if (object.is_string()) chars = code_points(object.as_string());
  const std::int64_t len = object.is_string() ? static_cast<std::int64_t>(chars.size())
                                              : static_cast<std::int64_t>(object.as_list().items.size());
  const std::int64_t step = step_v.is_int() ? step_v.as_int() : 1;
  const int direction = step > 0 ? 1 : (step < 0 ? -1 : 0);
  std::int64_t start = 0, stop = 0;
  if (direction >= 0) {
    start = start_v.is_int() ? start_v.as_int() : 0;
    start = start < 0 ? std::max<std::int64_t>(len + start, 0) : std::min(start, len);
    stop = stop_v.is_int() ? stop_v.as_int() : len;
    stop = stop < 0 ? std::max<std::int64_t>(len + stop, 0) : std::min(stop, len);
  } else {
    start = start_v.is_int() ? start_v.as_int() : len - 1;
    start = start < 0 ? std::max<std::int64_t>(len + start, -1) : std::min(start, len - 1);
    stop = stop_v.is_int() ? stop_v.as_int() : -1;
    stop = stop < -1 ? std::max<std::int64_t>(len + stop, -1) : std::min(stop, len - 1);
  }
  std::vector<std::size_t> picked;
  if (direction != 0) {
    for (std::int64_t i = start; direction * i < direction * stop;) {
      picked.push_back(static_cast<std::size_t>(i));
      if ((step > 0 && i > std::numeric_limits<std::int64_t>::max() - step) ||
          (step < 0 && i < std::numeric_limits<std::int64_t>::min() - step))
        break;
      i += step;
    }
  }
  if (object.is_string()) {
    std::string out;
    for (auto i : picked) out.append(chars[i]);
    return value::string(std::move(out));
  }
  std::vector<value> out;
  out.reserve(picked.size());
  for (auto i : picked) out.push_back(object.as_list().items[i]);
  return make_list(std::move(out));
}

}  // namespace troupe::text::jinja

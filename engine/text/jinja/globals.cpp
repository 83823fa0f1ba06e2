// The functions and constants every render starts with.
#include <algorithm>
#include <cmath>

#include "engine/text/jinja/detail/evaluator.hpp"
#include "engine/text/jinja/detail/js_text.hpp"

namespace troupe::text::jinja {
namespace {

using fn_type = std::function<fallible<value>(call_context&, call_args)>;

value function(std::string name, fn_type fn) {
  auto c = std::make_shared<callable_data>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return value::function(std::move(c));
}

fallible<value> range(call_context& ctx, call_args args) {
  evaluator& ev = ctx.ev();
  const auto& a = args.positional;
  if (a.empty() || a.size() > 3) return troupe::unexpected(ev.type_error("range() takes one to three integers"));
  for (const auto& x : a)
    if (!x.is_int()) return troupe::unexpected(ev.type_error("range() takes integers, not " + a_kind(x.kind())));
  const std::int64_t start = a.size() == 1 ? 0 : a[0].as_int();
  const std::int64_t stop = a.size() == 1 ? a[0].as_int() : a[1].as_int();
  const std::int64_t step = a.size() == 3 ? a[2].as_int() : 1;
  if (step == 0) return troupe::unexpected(ev.type_error("range() step must not be zero"));
  // The count in floating point first, so a huge range is refused before anything is allocated.
  const double span = step > 0 ? double(stop) - double(start) : double(start) - double(stop);
  const double count = span <= 0 ? 0 : std::ceil(span / std::fabs(double(step)));
  if (count > double(ev.settings().limits.max_loop_iterations))
    return troupe::unexpected(ev.error(template_error_code::loop_limit,
                                       "range() of more than " + std::to_string(ev.settings().limits.max_loop_iterations) +
                                           " items"));
  std::vector<value> out;
  out.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(count); ++i) out.push_back(value::integer(start + i * step));
  return ev.make_list(std::move(out));
}

// Entries from namespace()'s or dict()'s positional argument: a map, or a list of [key, value] pairs.
fallible<void> entries_from(evaluator& ev, const value& source, ordered_map& out, const char* fn) {
  if (source.is_map()) {
    for (const auto& [k, v] : source.as_map().entries) out.set(k, v);
    return {};
  }
  if (!source.is_list()) return troupe::unexpected(ev.type_error(std::string(fn) + ": " + a_kind(source.kind()) + " is not iterable"));
  for (const auto& pair : source.as_list().items) {
    std::vector<value> kv;
    if (pair.is_list()) {
      kv = pair.as_list().items;
    } else if (pair.is_string()) {
      for (auto cp : detail::code_points(pair.as_string())) kv.push_back(value::string(std::string(cp)));
    }
    if (kv.size() != 2 || !kv[0].is_string())
      return troupe::unexpected(ev.type_error(std::string(fn) + " takes a map or pairs of a string key and a value"));
    out.set(kv[0].as_string(), kv[1]);
  }
  return {};
}

fallible<value> make_namespace(call_context& ctx, call_args args) {
  evaluator& ev = ctx.ev();
  if (args.positional.size() > 1)
    return troupe::unexpected(ev.type_error("namespace() takes at most one positional argument"));
  ordered_map entries;
  if (args.positional.size() == 1) TROUPE_JINJA_CHECK(entries_from(ev, args.positional[0], entries, "namespace()"));
  for (const auto& [k, v] : args.keyword) entries.set(k, v);
  return ev.make_namespace(std::move(entries));
}

fallible<value> make_dict(call_context& ctx, call_args args) {
  evaluator& ev = ctx.ev();
  if (args.positional.size() > 1) return troupe::unexpected(ev.type_error("dict() takes at most one positional argument"));
  ordered_map entries;
  if (args.positional.size() == 1) TROUPE_JINJA_CHECK(entries_from(ev, args.positional[0], entries, "dict()"));
  for (const auto& [k, v] : args.keyword) entries.set(k, v);
  return ev.make_map(std::move(entries));
}

fallible<value> raise_exception(call_context& ctx, call_args args) {
  evaluator& ev = ctx.ev();
  std::string message;
  // new Error(undefined) has an empty message; the reference's none is undefined underneath.
  if (!args.positional.empty() && !args.positional[0].is_undefined() && !args.positional[0].is_none()) {
    TROUPE_JINJA_TRY(text, ev.raw(args.positional[0]));
    message = std::move(text);
  }
  return troupe::unexpected(ev.error(template_error_code::raise_exception, std::move(message)));
}

// Python's strftime for the directives the reference knows (%Y %m %d %b %B %H %M %%); any other
// directive stays as written, as in the reference.
fallible<value> strftime_now(call_context& ctx, call_args args) {
  evaluator& ev = ctx.ev();
  static constexpr const char* months[] = {"January", "February", "March",     "April",   "May",      "June",
                                           "July",    "August",   "September", "October", "November", "December"};
  std::string format;
  if (!args.positional.empty() && !args.positional[0].is_undefined()) {
    TROUPE_JINJA_TRY(text, ev.raw(args.positional[0]));
    format = std::move(text);
  }
  const calendar_time& t = ev.settings().now;
  const int month = std::clamp(t.month, 1, 12);
  auto pad2 = [](int v) { return (v < 10 && v >= 0 ? "0" : "") + std::to_string(v); };
  std::string out;
  for (std::size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    const char d = format[i + 1];
    switch (d) {
      case 'Y': out += std::to_string(t.year); break;
      case 'm': out += pad2(month); break;
      case 'd': out += pad2(t.day); break;
      case 'b': out += std::string(months[month - 1]).substr(0, 3); break;
      case 'B': out += months[month - 1]; break;
      case 'H': out += pad2(t.hour); break;
      case 'M': out += pad2(t.minute); break;
      case '%': out += '%'; break;
      default: out.push_back('%'); continue;
    }
    ++i;
  }
  return ev.make_string(std::move(out));
}

constexpr std::string_view reference_globals[] = {"namespace", "false", "true",         "none", "raise_exception",
                                                  "range",     "True",  "False",        "None", "strftime_now"};

}  // namespace

bool is_global_name(std::string_view n) {
  return std::find(std::begin(reference_globals), std::end(reference_globals), n) != std::end(reference_globals);
}

void add_globals(environment& env) {
  static const value range_fn = function("range", range);
  static const value namespace_fn = function("namespace", make_namespace);
  static const value dict_fn = function("dict", make_dict);
  static const value raise_fn = function("raise_exception", raise_exception);
  static const value strftime_fn = function("strftime_now", strftime_now);
  env.set("namespace", namespace_fn);
  env.set("false", value::boolean(false));
  env.set("true", value::boolean(true));
  env.set("none", value::none());
  env.set("raise_exception", raise_fn);
  env.set("range", range_fn);
  env.set("strftime_now", strftime_fn);
  env.set("True", value::boolean(true));
  env.set("False", value::boolean(false));
  env.set("None", value::none());
  env.set("dict", dict_fn);
}

}  // namespace troupe::text::jinja

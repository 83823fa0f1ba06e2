#include "engine/text/jinja/value.hpp"

#include <algorithm>
#include <cmath>

#include "engine/text/jinja/detail/js_text.hpp"

namespace troupe::text::jinja {
namespace {

using detail::append_json_string;

// A bounded string builder: every append is checked against the output limit, so a value that would
// print to gigabytes (a list holding itself many times over) fails early instead of exhausting memory.
class bounded_text {
 public:
  explicit bounded_text(std::size_t max_bytes) : max_(max_bytes) {}
  result<void, template_error> append(std::string_view s) {
    if (out_.size() + s.size() > max_)
      return troupe::unexpected(value_error(template_error_code::output_limit,
                                            "a value's text is longer than the output limit of " +
                                                std::to_string(max_) + " bytes"));
    out_.append(s);
    return {};
  }
  std::string& text() { return out_; }

 private:
  std::size_t max_;
  std::string out_;
};

template_error too_deep(int max_depth) {
  return value_error(template_error_code::recursion_limit,
                     "values nest deeper than the recursion limit of " + std::to_string(max_depth));
}

// The primary weight of an ASCII character in ICU's root collation, which localeCompare uses:
// whitespace, punctuation, symbols, digits, then letters with case ignored.
int collation_weight(unsigned char c) {
  static constexpr std::string_view order =
      "\t\n _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789abcdefghijklmnopqrstuvwxyz";
  if (c >= 'A' && c <= 'Z') c = static_cast<unsigned char>(c + 32);
  const auto p = order.find(static_cast<char>(c));
  return p == std::string_view::npos ? -1 : static_cast<int>(p);
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// localeCompare for keys: ICU's order for ASCII (letters before case, lower case first); other text
// falls back to code unit order.
int locale_compare(std::string_view a, std::string_view b) {
  if (!is_ascii(a) || !is_ascii(b)) return detail::utf16_compare(a, b);
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const int wa = collation_weight(static_cast<unsigned char>(a[i]));
    const int wb = collation_weight(static_cast<unsigned char>(b[i]));
    if (wa != wb) return wa < wb ? -1 : 1;
  }
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  for (std::size_t i = 0; i < n; ++i) {
    const bool la = a[i] >= 'a' && a[i] <= 'z', lb = b[i] >= 'a' && b[i] <= 'z';
    if (la != lb) return la ? -1 : 1;
  }
  return 0;
}

result<void, template_error> write_json(const value& v, const json_options& o, int depth, int max_depth,
                                        bounded_text& out);

result<void, template_error> write_json_number(const value& v, bounded_text& out) {
  if (v.is_int()) return out.append(detail::js_integer(v.as_int()));
  const double d = v.as_float();
  return out.append(std::isfinite(d) ? detail::js_number(d) : "null");
}

result<void, template_error> write_json(const value& v, const json_options& o, int depth, int max_depth,
                                        bounded_text& out) {
  if (depth > max_depth) return troupe::unexpected(too_deep(max_depth));
  std::string item_sep = o.has_separators ? o.item_separator : (o.indent > 0 ? "," : ", ");
  std::string key_sep = o.has_separators ? o.key_separator : ": ";
  switch (v.kind()) {
    case value_kind::none: return out.append("null");
    case value_kind::undefined: return out.append(o.undefined_as_null ? "null" : "undefined");
    case value_kind::boolean: return out.append(v.as_bool() ? "true" : "false");
    case value_kind::integer:
    case value_kind::floating: return write_json_number(v, out);
    case value_kind::string: {
      std::string s;
      append_json_string(s, v.as_string(), o.ensure_ascii);
      return out.append(s);
    }
    case value_kind::callable:
      return troupe::unexpected(value_error(template_error_code::type_error, "cannot convert a function to JSON"));
    case value_kind::list:
    case value_kind::map:
    case value_kind::name_space: break;
  }
  const std::string indent_unit(static_cast<std::size_t>(std::max(o.indent, 0)), ' ');
  std::string base_padding = "\n";
  for (int i = 0; i < depth; ++i) base_padding += indent_unit;
  const std::string child_padding = base_padding + indent_unit;
  const bool pretty = o.indent > 0;
  if (v.is_list()) {
    const auto& l = v.as_list();
    if (l.tuple)
      return troupe::unexpected(value_error(template_error_code::type_error, "cannot convert a tuple to JSON"));
    if (auto r = out.append("["); !r) return r;
    for (std::size_t i = 0; i < l.items.size(); ++i) {
      if (i > 0)
        if (auto r = out.append(item_sep); !r) return r;
      if (pretty)
        if (auto r = out.append(child_padding); !r) return r;
      if (auto r = write_json(l.items[i], o, depth + 1, max_depth, out); !r) return r;
    }
    if (pretty && !l.items.empty())
      if (auto r = out.append(base_padding); !r) return r;
    return out.append("]");
  }
  const auto& m = v.as_map().entries;
  std::vector<const ordered_map::entry*> entries;
  entries.reserve(m.size());
  for (const auto& e : m) entries.push_back(&e);
  if (o.sort_keys)
    std::stable_sort(entries.begin(), entries.end(),
                     [](const auto* a, const auto* b) { return locale_compare(a->first, b->first) < 0; });
  if (auto r = out.append("{"); !r) return r;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i > 0)
      if (auto r = out.append(item_sep); !r) return r;
    if (pretty)
      if (auto r = out.append(child_padding); !r) return r;
    std::string key;
    append_json_string(key, entries[i]->first, o.ensure_ascii);
    key += key_sep;
    if (auto r = out.append(key); !r) return r;
    if (auto r = write_json(entries[i]->second, o, depth + 1, max_depth, out); !r) return r;
  }
  if (pretty && !entries.empty())
    if (auto r = out.append(base_padding); !r) return r;
  return out.append("}");
}

result<void, template_error> write_display(const value& v, int depth, int max_depth, bounded_text& out) {
  switch (v.kind()) {
    // The reference's none holds JavaScript's undefined, so it prints as "undefined" too.
    case value_kind::undefined:
    case value_kind::none: return out.append("undefined");
    case value_kind::boolean: return out.append(v.as_bool() ? "true" : "false");
    case value_kind::integer: return out.append(detail::js_integer(v.as_int()));
    case value_kind::floating: return out.append(detail::js_float(v.as_float()));
    case value_kind::string: return out.append(v.as_string());
    case value_kind::callable: return out.append("[function " + v.as_callable().name + "]");
    case value_kind::list:
    case value_kind::map:
    case value_kind::name_space: {
      json_options o;
      o.undefined_as_null = false;
      return write_json(v, o, depth, max_depth, out);
    }
  }
  return {};
}

result<void, template_error> write_raw(const value& v, int depth, int max_depth, bounded_text& out) {
  if (depth > max_depth) return troupe::unexpected(too_deep(max_depth));
  switch (v.kind()) {
    case value_kind::integer:
    case value_kind::floating: return out.append(detail::js_number(v.as_number()));
    case value_kind::map:
    case value_kind::name_space: return out.append("[object Map]");
    case value_kind::list: {
      // Array#toString joins the elements' own toString (the display form) with commas.
      const auto& items = v.as_list().items;
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0)
          if (auto r = out.append(","); !r) return r;
        if (auto r = write_display(items[i], depth + 1, max_depth, out); !r) return r;
      }
      return {};
    }
    default: return write_display(v, depth, max_depth, out);
  }
}

}  // namespace

std::string_view name(value_kind kind) {
  switch (kind) {
    case value_kind::undefined: return "undefined";
    case value_kind::none: return "none";
    case value_kind::boolean: return "boolean";
    case value_kind::integer: return "integer";
    case value_kind::floating: return "float";
    case value_kind::string: return "string";
    case value_kind::list: return "list";
    case value_kind::map: return "map";
    case value_kind::name_space: return "namespace";
    case value_kind::callable: return "function";
  }
  return "unknown";
}

std::string a_kind(value_kind kind) {
  switch (kind) {
    case value_kind::undefined: return "an undefined value";
    case value_kind::none: return "none";
    case value_kind::integer: return "an integer";
    default: return "a " + std::string(name(kind));
  }
}

value value::none() { return value(value_kind::none); }
value value::boolean(bool b) {
  value v(value_kind::boolean);
  v.scalar_.b = b;
  return v;
}
value value::integer(std::int64_t i) {
  value v(value_kind::integer);
  v.scalar_.i = i;
  return v;
}
value value::floating(double d) {
  value v(value_kind::floating);
  v.scalar_.d = d;
  return v;
}
value value::string(std::string s) {
  value v(value_kind::string);
  v.shared_ = std::make_shared<std::string>(std::move(s));
  return v;
}
value value::list(std::vector<value> items, bool tuple) {
  auto l = std::make_shared<list_data>();
  int d = 0;
  for (const auto& x : items) d = std::max(d, x.depth());
  l->items = std::move(items);
  l->tuple = tuple;
  l->depth = d + 1;
  value v(value_kind::list);
  v.shared_ = std::move(l);
  return v;
}
value value::map(std::shared_ptr<map_data> m) {
  value v(value_kind::map);
  v.shared_ = std::move(m);
  return v;
}
value value::name_space(std::shared_ptr<map_data> m) {
  value v(value_kind::name_space);
  v.shared_ = std::move(m);
  return v;
}
value value::function(std::shared_ptr<const callable_data> f) {
  value v(value_kind::callable);
  v.shared_ = std::const_pointer_cast<callable_data>(std::move(f));
  return v;
}

double value::as_number() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return as_float();
}

const void* value::identity() const {
  switch (kind_) {
    case value_kind::list:
    case value_kind::map:
    case value_kind::name_space:
    case value_kind::callable: return shared_.get();
    default: return nullptr;
  }
}

bool value::truthy() const {
  switch (kind_) {
    case value_kind::undefined:
    case value_kind::none: return false;
    case value_kind::boolean: return as_bool();
    case value_kind::integer: return as_int() != 0;
    case value_kind::floating: return as_float() != 0 && !std::isnan(as_float());
    case value_kind::string: return !as_string().empty();
    case value_kind::list: return !as_list().items.empty();
    case value_kind::map: return !as_map().entries.empty();
    case value_kind::name_space:
    case value_kind::callable: return true;
  }
  return false;
}

int value::depth() const {
  if (is_list()) return as_list().depth;
  if (is_map()) return as_map().depth;
  return is_namespace() ? 1 : 0;
}

const value* ordered_map::find(std::string_view key) const {
  for (const auto& e : entries_)
    if (e.first == key) return &e.second;
  return nullptr;
}

void ordered_map::set(std::string key, value v) {
  for (auto& e : entries_)
    if (e.first == key) {
      e.second = std::move(v);
      return;
    }
  entries_.emplace_back(std::move(key), std::move(v));
}

std::shared_ptr<map_data> make_map(ordered_map entries) {
  auto m = std::make_shared<map_data>();
  int d = 0;
  for (const auto& [k, v] : entries) d = std::max(d, v.depth());
  m->entries = std::move(entries);
  m->depth = d + 1;
  return m;
}

template_error value_error(template_error_code code, std::string message) {
  template_error e;
  e.code = code;
  e.message = std::move(message);
  return e;
}

result<std::string, template_error> display_string(const value& v, std::size_t max_bytes, int max_depth) {
  if (v.is_string()) return v.as_string();
  bounded_text out(max_bytes);
  if (auto r = write_display(v, 0, max_depth, out); !r) return troupe::unexpected(std::move(r.error()));
  return std::move(out.text());
}

result<std::string, template_error> raw_string(const value& v, std::size_t max_bytes, int max_depth) {
  if (v.is_string()) return v.as_string();
  bounded_text out(max_bytes);
  if (auto r = write_raw(v, 0, max_depth, out); !r) return troupe::unexpected(std::move(r.error()));
  return std::move(out.text());
}

result<std::string, template_error> to_json(const value& v, const json_options& options, std::size_t max_bytes,
                                            int max_depth) {
  bounded_text out(max_bytes);
  if (auto r = write_json(v, options, 0, max_depth, out); !r) return troupe::unexpected(std::move(r.error()));
  return std::move(out.text());
}

bool strict_equals(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) return a.as_number() == b.as_number();
  // Both hold JavaScript's undefined in the reference.
  if ((a.is_none() || a.is_undefined()) && (b.is_none() || b.is_undefined())) return true;
  if (a.kind() != b.kind()) {
    return false;
  }
  switch (a.kind()) {
    case value_kind::undefined:
    case value_kind::none: return true;
    case value_kind::boolean: return a.as_bool() == b.as_bool();
    case value_kind::string: return a.as_string() == b.as_string();
    default: return a.identity() == b.identity();
  }
}

bool loose_equals(const value& a, const value& b) {
  const bool a_nullish = a.is_none() || a.is_undefined(), b_nullish = b.is_none() || b.is_undefined();
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  const bool a_object = a.identity() != nullptr, b_object = b.identity() != nullptr;
  if (a_object && b_object) return a.identity() == b.identity();
  if (a_object || b_object) {
    // An object against a primitive: JavaScript compares the object's string form. Lists print as
    // their elements joined by commas, maps as "[object Map]".
    const value& obj = a_object ? a : b;
    const value& prim = a_object ? b : a;
    if (obj.is_callable()) return false;
    auto text = raw_string(obj, std::size_t{1} << 20, 64);
    if (!text) return false;
    return loose_equals(value::string(std::move(*text)), prim);
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  // Numbers, booleans and strings meet as numbers; a string that is no number is NaN.
  auto to_number = [](const value& v) { return v.is_string() ? detail::js_to_number(v.as_string()) : v.as_number(); };
  return to_number(a) == to_number(b);
}

}  // namespace troupe::text::jinja

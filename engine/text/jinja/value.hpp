#pragma once
// A template value: undefined, none, boolean, integer, float, string, list, map, namespace or callable.
// Values are cheap to copy: strings and containers are shared and never change after they are made,
// except a namespace, which `{% set ns.x = ... %}` changes in place (every copy sees the change, as in
// Jinja). Maps keep insertion order, like the JavaScript Map the reference implementation uses.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/template_error.hpp"

namespace troupe::text::jinja {

class value;
struct list_data;
struct map_data;
struct callable_data;

enum class value_kind : std::uint8_t {
  undefined, none, boolean, integer, floating, string, list, map, name_space, callable,
};
std::string_view name(value_kind kind);
// The kind with its article, for messages: "an integer", "a string", "none", "an undefined value".
std::string a_kind(value_kind kind);

class value {
 public:
  value() = default;  // undefined
  static value none();
  static value boolean(bool b);
  static value integer(std::int64_t i);
  static value floating(double d);
  static value string(std::string s);
  // A list; `tuple` marks one written as (a, b), which the reference treats apart in a few places.
  static value list(std::vector<value> items, bool tuple = false);
  static value map(std::shared_ptr<map_data> m);
  static value name_space(std::shared_ptr<map_data> m);
  static value function(std::shared_ptr<const callable_data> f);

  value_kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == value_kind::undefined; }
  bool is_none() const { return kind_ == value_kind::none; }
  bool is_bool() const { return kind_ == value_kind::boolean; }
  bool is_int() const { return kind_ == value_kind::integer; }
  bool is_float() const { return kind_ == value_kind::floating; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind_ == value_kind::string; }
  bool is_list() const { return kind_ == value_kind::list; }
  bool is_map() const { return kind_ == value_kind::map; }
  bool is_namespace() const { return kind_ == value_kind::name_space; }
  // A map or a namespace: the values whose attributes are entries.
  bool is_attribute_container() const { return is_map() || is_namespace(); }
  bool is_callable() const { return kind_ == value_kind::callable; }

  bool as_bool() const { return scalar_.b; }
  std::int64_t as_int() const { return scalar_.i; }
  double as_float() const { return scalar_.d; }
  // An integer or float as double; a boolean as 0 or 1.
  double as_number() const;
  const std::string& as_string() const { return *static_cast<const std::string*>(shared_.get()); }
  const list_data& as_list() const { return *static_cast<const list_data*>(shared_.get()); }
  const map_data& as_map() const { return *static_cast<const map_data*>(shared_.get()); }
  map_data& mutable_map() const { return *static_cast<map_data*>(shared_.get()); }
  const callable_data& as_callable() const { return *static_cast<const callable_data*>(shared_.get()); }
  // The shared container or function, for identity comparisons (the reference compares those by
  // reference); null for other kinds.
  const void* identity() const;

  // Python truthiness as the reference computes it: empty strings, lists and maps are false; a
  // namespace is always true.
  bool truthy() const;
  // How deep containers nest inside this value (0 for a scalar); namespaces count as one level.
  int depth() const;

 private:
  union scalar {
    bool b;
    std::int64_t i;
    double d;
  };
  explicit value(value_kind k) : kind_(k) {}

  value_kind kind_ = value_kind::undefined;
  scalar scalar_{.i = 0};               // booleans and numbers
  std::shared_ptr<void> shared_;       // the string, list, map or function of the other kinds
};

// String keys in insertion order; setting an existing key keeps its place.
class ordered_map {
 public:
  using entry = std::pair<std::string, value>;

  const value* find(std::string_view key) const;
  void set(std::string key, value v);
  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  std::vector<entry> entries_;
};

struct list_data {
  std::vector<value> items;
  bool tuple = false;
  int depth = 1;
};

struct map_data {
  ordered_map entries;
  int depth = 1;  // for a map: 1 + the deepest entry's depth, set by make_map
};

// A map's shared data, its depth computed from its entries.
std::shared_ptr<map_data> make_map(ordered_map entries);

// A call's arguments: positional ones in order, keyword ones by name.
struct call_args {
  std::vector<value> positional;
  ordered_map keyword;
};

class call_context;

struct callable_data {
  std::string name;
  // Runs the function; the context gives access to the renderer (for macros) and the calling scope.
  std::function<result<value, template_error>(call_context&, call_args)> fn;
};

// Shorthand for the errors values raise.
template_error value_error(template_error_code code, std::string message);

// The text `{{ v }}` prints (the reference's toString): "true", "1.0", JSON for containers (undefined
// inside them as `undefined`). Fails for a tuple or a function inside a container, and when the text
// would pass max_bytes or nest deeper than max_depth.
result<std::string, template_error> display_string(const value& v, std::size_t max_bytes, int max_depth);

// String(v.value) in the reference, which `+` and `~` use: numbers without ".0", "[object Map]" for
// maps, a list as its elements' display strings joined by ",".
result<std::string, template_error> raw_string(const value& v, std::size_t max_bytes, int max_depth);

struct json_options {
  int indent = 0;             // 0: one line
  bool ensure_ascii = false;  // escape every UTF-16 code unit from 0x7f up
  bool sort_keys = false;     // sort map keys as JavaScript's localeCompare does for ASCII
  bool has_separators = false;
  std::string item_separator;  // with has_separators: between items
  std::string key_separator;   // with has_separators: between a key and its value
  bool undefined_as_null = true;
};
// The tojson filter: JSON.stringify-like, with Python json.dumps' separators (", " and ": "; "," and
// ": " when indenting) and map keys in insertion order.
result<std::string, template_error> to_json(const value& v, const json_options& options, std::size_t max_bytes,
                                            int max_depth);

// JavaScript's `a == b` on the two values' payloads, which the reference uses for == and !=.
bool loose_equals(const value& a, const value& b);
// JavaScript's `a === b` on the payloads: `in`, equalto and unique use it.
bool strict_equals(const value& a, const value& b);

// The input data as template values: JSON text (an object, array or scalar) with JavaScript's
// Object.entries order for keys (integer-like keys first, ascending) and its number rules (an integral
// number is an integer). Nesting deeper than max_depth is refused.
result<value, template_error> value_from_json(std::string_view json, int max_depth = 256);

}  // namespace troupe::text::jinja

// JSON input to template values, with the conversions JavaScript applies when the reference receives
// the same JSON: JSON.parse, then Object.entries order and Number.isInteger for the number kind.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "engine/text/jinja/detail/js_text.hpp"
#include "engine/text/jinja/value.hpp"

namespace troupe::text::jinja {
namespace {

using json = nlohmann::ordered_json;

// A canonical array index ("0", "17", not "01" or "-1", below 2^32 - 1): JavaScript objects list such
// keys first, in ascending order, before the others in insertion order.
std::optional<std::uint32_t> array_index(const std::string& key) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : key) {
    if (!detail::is_ascii_digit(c)) return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v >= 0xFFFFFFFFull) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

value number(double d) {
  // JSON.parse gives doubles; an integral one is an integer to the reference.
  if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) < 9.2e18) return value::integer(static_cast<std::int64_t>(d));
  return value::floating(d);
}

result<value, template_error> convert(const json& j, int depth, int max_depth) {
  if (depth > max_depth)
    return troupe::unexpected(value_error(template_error_code::invalid_input,
                                          "the JSON nests deeper than " + std::to_string(max_depth) + " levels"));
  switch (j.type()) {
    case json::value_t::null: return value::none();
    case json::value_t::boolean: return value::boolean(j.get<bool>());
    case json::value_t::number_integer: {
      const auto i = j.get<std::int64_t>();
      // Beyond 2^53 JavaScript rounds to the nearest double.
      if (i > (std::int64_t{1} << 53) || i < -(std::int64_t{1} << 53)) return number(static_cast<double>(i));
      return value::integer(i);
    }
    case json::value_t::number_unsigned: return number(static_cast<double>(j.get<std::uint64_t>()));
    case json::value_t::number_float: return number(j.get<double>());
    case json::value_t::string: return value::string(j.get<std::string>());
    case json::value_t::array: {
      std::vector<value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        auto v = convert(e, depth + 1, max_depth);
        if (!v) return v;
        items.push_back(std::move(*v));
      }
      return value::list(std::move(items));
    }
    case json::value_t::object: {
      std::vector<std::pair<std::string, const json*>> entries;
      for (auto it = j.begin(); it != j.end(); ++it) entries.emplace_back(it.key(), &it.value());
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
        const auto ia = array_index(a.first), ib = array_index(b.first);
        if (ia && ib) return *ia < *ib;
        return ia.has_value() && !ib.has_value();
      });
      ordered_map m;
      for (const auto& [k, v] : entries) {
        auto converted = convert(*v, depth + 1, max_depth);
        if (!converted) return converted;
        m.set(k, std::move(*converted));
      }
      return value::map(make_map(std::move(m)));
    }
    default: return value::none();
  }
}

}  // namespace

result<value, template_error> value_from_json(std::string_view text, int max_depth) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return troupe::unexpected(value_error(template_error_code::invalid_input, std::string("not valid JSON: ") + e.what()));
  }
  return convert(j, 0, max_depth);
}

}  // namespace troupe::text::jinja

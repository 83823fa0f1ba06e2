#include "engine/load/raw_config.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "engine/load/detail/json_document.hpp"
#include "engine/load/detail/mapped_file.hpp"
#include "engine/load/detail/utf8.hpp"

namespace troupe::load {

using json = nlohmann::json;

namespace {

// A key found in a JSON object: the literal key first, then each dotted split of it into an object
// member and a key inside that member; a null is passed over like an absent key. Visits each object of
// the document at most once per lookup.
const json* json_lookup(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  if (const auto it = obj.find(std::string(key)); it != obj.end() && !it->is_null()) return &*it;
  for (auto dot = key.find('.'); dot != std::string_view::npos; dot = key.find('.', dot + 1)) {
    const auto it = obj.find(std::string(key.substr(0, dot)));
    if (it == obj.end() || !it->is_object()) continue;
    if (const json* r = json_lookup(*it, key.substr(dot + 1))) return r;
  }
  return nullptr;
}

// `prefix` is null at the top level: an empty key is a key like any other ("" then ".x" below it).
void json_leaves(const json& obj, const std::string* prefix, std::vector<std::string>& out) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string path = prefix ? *prefix + "." + it.key() : it.key();
    if (it->is_object())
      json_leaves(*it, &path, out);
    else if (!it->is_null())
      out.push_back(path);
  }
}

std::optional<std::int64_t> json_int(const json& j) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<std::int64_t>();
  return std::nullopt;
}
std::optional<double> json_float(const json& j) {
  if (j.is_number()) return j.get<double>();
  return std::nullopt;
}
std::optional<bool> json_bool(const json& j) {
  if (j.is_boolean()) return j.get<bool>();
  return std::nullopt;
}
std::optional<std::string> json_string(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  return std::nullopt;
}
template <class T, class Elem>
std::optional<std::vector<T>> json_array(const json& j, Elem elem) {
  if (!j.is_array()) return std::nullopt;
  std::vector<T> out;
  out.reserve(j.size());
  for (const auto& e : j) {
    auto v = elem(e);
    if (!v) return std::nullopt;
    out.push_back(std::move(*v));
  }
  return out;
}

std::optional<std::int64_t> gguf_int(const gguf_value& v) { return v.as_int(); }
std::optional<double> gguf_float(const gguf_value& v) { return v.as_float(); }
std::optional<bool> gguf_bool(const gguf_value& v) {
  if (const auto* b = v.get_if<bool>()) return *b;
  return std::nullopt;
}
std::optional<std::string> gguf_string(const gguf_value& v) {
  if (const auto* s = v.get_if<std::string>()) return *s;
  return std::nullopt;
}
template <class T, class Elem>
std::optional<std::vector<T>> gguf_array_of(const gguf_value& v, Elem elem) {
  const auto* a = v.get_if<gguf_array>();
  if (!a) return std::nullopt;
  std::vector<T> out;
  out.reserve(a->size());
  for (std::size_t i = 0; i < a->size(); ++i) {
    auto x = elem(a->at(i));
    if (!x) return std::nullopt;
    out.push_back(std::move(*x));
  }
  return out;
}

std::string gguf_kind(const gguf_value& v) {
  if (const auto* a = v.get_if<gguf_array>()) return "an array of " + std::string(name(a->type));
  return "a " + std::string(name(v.type()));
}
std::string json_kind_of(const json& j) {
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return "a " + std::string(detail::json_kind(j));
}

}  // namespace

struct raw_config::impl {
  config_source source = config_source::hf_json;
  std::string name;
  json doc;                         // for hf_json
  std::optional<gguf_file> gguf;    // for gguf


  template <class T, class FromJson, class FromGguf>
  result<T, load_error> get(std::string_view key, const char* expected, FromJson from_json,
                            FromGguf from_gguf) const {
    const auto missing = [&] {
      return troupe::unexpected(load_error{load_error_code::missing_key, name, detail::printable(key), "no such key"});
    };
    const auto wrong = [&](const std::string& found) {
      return troupe::unexpected(load_error{load_error_code::wrong_type, name, detail::printable(key),
                                           "holds " + found + ", expected " + expected});
    };
    if (gguf) {
      const auto v = gguf->find_value(key);
      if (!v) return missing();
      auto x = from_gguf(v->get());
      if (!x) return wrong(gguf_kind(v->get()));
      return std::move(*x);
    }
    const json* j = json_lookup(doc, key);
    if (!j) return missing();
    auto x = from_json(*j);
    if (!x) return wrong(json_kind_of(*j));
    return std::move(*x);
  }
};

result<raw_config, load_error> raw_config::from_json_string(std::string_view text, std::string name) {
  auto doc = detail::parse_json(text, name);
  if (!doc) return troupe::unexpected(std::move(doc.error()));
  if (!doc->is_object())
    return troupe::unexpected(load_error{load_error_code::bad_header, name, "",
                                         "config is " + json_kind_of(*doc) + ", expected an object"});
  auto i = std::make_shared<impl>();
  i->source = config_source::hf_json;
  i->name = std::move(name);
  i->doc = std::move(*doc);
  return raw_config(std::move(i));
}

result<raw_config, load_error> raw_config::from_json_file(const std::filesystem::path& path) {
  auto mapping = detail::mapped_file::open(path);
  if (!mapping) return troupe::unexpected(std::move(mapping.error()));
  const auto bytes = (*mapping)->bytes();
  return from_json_string(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string());
}

std::optional<raw_config> raw_config::section(std::string_view key) const {
  if (impl_->gguf) return std::nullopt;
  const json* j = json_lookup(impl_->doc, key);
  if (!j || !j->is_object()) return std::nullopt;
  auto i = std::make_shared<impl>();
  i->source = config_source::hf_json;
  i->name = impl_->name + ":" + std::string(key);
  i->doc = *j;
  return raw_config(std::move(i));
}

raw_config raw_config::from_gguf(const gguf_file& file) {
  auto i = std::make_shared<impl>();
  i->source = config_source::gguf;
  i->name = file.name();
  i->gguf = file;
  return raw_config(std::move(i));
}

result<raw_config, load_error> raw_config::open(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return from_json_file(path / "config.json");
  if (path.extension() == ".gguf") {
    auto g = gguf_file::open(path);
    if (!g) return troupe::unexpected(std::move(g.error()));
    return from_gguf(*g);
  }
  return from_json_file(path);
}

config_source raw_config::source() const { return impl_->source; }
const std::string& raw_config::name() const { return impl_->name; }

bool raw_config::has(std::string_view key) const {
  if (impl_->gguf) return impl_->gguf->find_value(key).has_value();
  return json_lookup(impl_->doc, key) != nullptr;
}

result<std::int64_t, load_error> raw_config::get_int(std::string_view key) const {
  return impl_->get<std::int64_t>(key, "an integer", json_int, gguf_int);
}
result<double, load_error> raw_config::get_float(std::string_view key) const {
  return impl_->get<double>(key, "a number", json_float, gguf_float);
}
result<bool, load_error> raw_config::get_bool(std::string_view key) const {
  return impl_->get<bool>(key, "a bool", json_bool, gguf_bool);
}
result<std::string, load_error> raw_config::get_string(std::string_view key) const {
  return impl_->get<std::string>(key, "a string", json_string, gguf_string);
}
result<std::vector<std::int64_t>, load_error> raw_config::get_int_array(std::string_view key) const {
  return impl_->get<std::vector<std::int64_t>>(
      key, "an array of integers", [](const json& j) { return json_array<std::int64_t>(j, json_int); },
      [](const gguf_value& v) { return gguf_array_of<std::int64_t>(v, gguf_int); });
}
result<std::vector<double>, load_error> raw_config::get_float_array(std::string_view key) const {
  return impl_->get<std::vector<double>>(
      key, "an array of numbers", [](const json& j) { return json_array<double>(j, json_float); },
      [](const gguf_value& v) { return gguf_array_of<double>(v, gguf_float); });
}
result<std::vector<std::string>, load_error> raw_config::get_string_array(std::string_view key) const {
  return impl_->get<std::vector<std::string>>(
      key, "an array of strings", [](const json& j) { return json_array<std::string>(j, json_string); },
      [](const gguf_value& v) { return gguf_array_of<std::string>(v, gguf_string); });
}

std::vector<std::string> raw_config::keys() const {
  std::vector<std::string> out;
  if (impl_->gguf) {
    for (const auto& kv : impl_->gguf->metadata()) out.push_back(kv.key);
  } else {
    json_leaves(impl_->doc, nullptr, out);
    std::sort(out.begin(), out.end());
  }
  return out;
}

}  // namespace troupe::load

#include "engine/load/safetensors.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "engine/load/detail/file_writer.hpp"
#include "engine/load/detail/json_document.hpp"
#include "engine/load/detail/mapped_file.hpp"
#include "engine/load/detail/utf8.hpp"

namespace troupe::load {

using json = nlohmann::json;

struct detail::safetensors_state {
  std::string name;
  std::shared_ptr<const detail::mapped_file> mapping;  // null when the caller owns the bytes
  std::vector<named_view> tensors;
  std::map<std::string, std::size_t, std::less<>> index;
  string_map metadata;
  std::size_t data_offset = 0;
};

namespace {

// The reference implementation refuses headers above 100 MB; a larger one is a corrupt length.
constexpr std::uint64_t max_header_bytes = 100'000'000;
constexpr std::string_view metadata_key = "__metadata__";

std::string range_str(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

struct entry {
  std::string name;
  dtype type;
  troupe::shape shape;
  std::uint64_t begin;
  std::uint64_t end;
};

class header_reader {
 public:
  explicit header_reader(const std::string& file) : file_(file) {}

  result<entry, load_error> read_entry(const std::string& name, const json& v) const {
    if (!v.is_object()) return fail(load_error_code::bad_header, name, "entry is " + kind(v) + ", expected an object");
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& k = it.key();
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        return fail(load_error_code::bad_header, name, "unexpected field '" + detail::printable(k) + "'");
    }
    for (const char* k : {"dtype", "shape", "data_offsets"})
      if (!v.contains(k)) return fail(load_error_code::bad_header, name, std::string("missing field '") + k + "'");

    const json& jd = v["dtype"];
    if (!jd.is_string()) return fail(load_error_code::bad_header, name, "dtype is " + kind(jd) + ", expected a string");
    const auto& code = jd.get_ref<const std::string&>();
    const auto type = dtype_from_safetensors(code);
    if (!type) return fail(load_error_code::unknown_dtype, name, "unknown dtype '" + detail::printable(code) + "'");

    const json& js = v["shape"];
    if (!js.is_array()) return fail(load_error_code::bad_header, name, "shape is " + kind(js) + ", expected an array");
    if (js.size() > troupe::shape::max_rank)
      return fail(load_error_code::bad_header, name,
                  "rank " + std::to_string(js.size()) + " above " + std::to_string(troupe::shape::max_rank));
    std::int64_t dims[troupe::shape::max_rank] = {};
    for (std::size_t i = 0; i < js.size(); ++i) {
      const json& d = js[i];
      if (d.is_number_unsigned()) {
        const auto u = d.get<std::uint64_t>();
        if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
          return fail(load_error_code::shape_overflow, name, "dimension " + std::to_string(u) + " above 2^63 - 1");
        dims[i] = static_cast<std::int64_t>(u);
      } else if (d.is_number_integer()) {
        return fail(load_error_code::bad_header, name, "negative dimension " + std::to_string(d.get<std::int64_t>()));
      } else {
        return fail(load_error_code::bad_header, name, "dimension is " + kind(d) + ", expected an integer");
      }
    }
    const troupe::shape shape(std::span<const std::int64_t>(dims, js.size()));
    const auto numel = shape.checked_numel();
    if (!numel) return fail(load_error_code::shape_overflow, name, "element count of " + shape.str() + " overflows");
    const auto bytes = storage_bytes(*type, static_cast<std::uint64_t>(*numel));
    if (!bytes)
      return fail(load_error_code::shape_overflow, name,
                  "byte count of " + shape.str() + " in " + std::string(troupe::name(*type)) + " overflows");

    const json& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      return fail(load_error_code::bad_header, name, "data_offsets must be two non-negative integers");
    const auto begin = jo[0].get<std::uint64_t>();
    const auto end = jo[1].get<std::uint64_t>();
    if (begin > end)
      return fail(load_error_code::bad_header, name, "data_offsets " + range_str(begin, end) + " end before they begin");
    if (end - begin != *bytes)
      return fail(load_error_code::bad_header, name,
                  "data_offsets " + range_str(begin, end) + " hold " + std::to_string(end - begin) + " bytes, " +
                      std::string(code) + " " + shape.str() + " needs " + std::to_string(*bytes));
    return entry{name, *type, shape, begin, end};
  }

  troupe::unexpected<load_error> fail(load_error_code code, const std::string& item, std::string reason) const {
    return troupe::unexpected(load_error{code, file_, detail::printable(item), std::move(reason)});
  }

 private:
  static std::string kind(const json& j) { return std::string(detail::json_kind(j)); }
  const std::string& file_;
};

std::uint64_t read_u64_le(const std::byte* p) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(p[i]);
  return n;
}

result<std::shared_ptr<detail::safetensors_state>, load_error> parse_image(std::span<const std::byte> bytes,
                                                                          std::string name) {
  auto st = std::make_shared<detail::safetensors_state>();
  st->name = std::move(name);
  const header_reader rd(st->name);
  if (bytes.size() < 8)
    return rd.fail(load_error_code::truncated_header, "",
                   "file of " + std::to_string(bytes.size()) + " bytes ends inside the 8-byte header length");
  const std::uint64_t n = read_u64_le(bytes.data());
  if (n > bytes.size() - 8)
    return rd.fail(load_error_code::header_too_large, "",
                   "header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(bytes.size()) + " bytes)");
  if (n > max_header_bytes)
    return rd.fail(load_error_code::header_too_large, "",
                   "header length " + std::to_string(n) + " above the limit of " + std::to_string(max_header_bytes));
  st->data_offset = static_cast<std::size_t>(8 + n);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(n));
  auto doc = detail::parse_json(text, st->name);
  if (!doc) return troupe::unexpected(std::move(doc.error()));
  if (!doc->is_object())
    return rd.fail(load_error_code::bad_header, "",
                   "header is " + std::string(detail::json_kind(*doc)) + ", expected an object");

  std::vector<entry> entries;
  for (auto it = doc->begin(); it != doc->end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == metadata_key) {
      if (!v.is_object())
        return rd.fail(load_error_code::bad_metadata, key,
                       "is " + std::string(detail::json_kind(v)) + ", expected an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return rd.fail(load_error_code::bad_metadata, key + "." + m.key(),
                         "is " + std::string(detail::json_kind(m.value())) + ", expected a string");
        st->metadata.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    auto e = rd.read_entry(key, v);
    if (!e) return troupe::unexpected(std::move(e.error()));
    entries.push_back(std::move(*e));
  }

  const auto data = bytes.subspan(st->data_offset);
  // Of the tensors past the end, the one that starts first tells a cut file (it starts inside the data,
  // the file just stops) from a header pointing elsewhere.
  const entry* past = nullptr;
  for (const auto& e : entries)
    if (e.end > data.size() && (!past || e.begin < past->begin)) past = &e;
  if (past) {
    const auto held = std::to_string(data.size());
    if (past->begin <= data.size())
      return rd.fail(load_error_code::truncated_data, past->name,
                     "needs bytes " + range_str(past->begin, past->end) + " of the data section; the file holds " +
                         held);
    return rd.fail(load_error_code::tensor_out_of_range, past->name,
                   "data_offsets " + range_str(past->begin, past->end) + " lie past the data section of " + held +
                       " bytes");
  }

  std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const entry* prev = nullptr;  // the non-empty tensor that ends last so far
  for (const auto& e : entries) {
    if (e.begin == e.end) continue;
    if (prev && e.begin < prev->end)
      return rd.fail(load_error_code::tensor_overlap, e.name,
                     "bytes " + range_str(e.begin, e.end) + " overlap '" + detail::printable(prev->name) + "' " +
                         range_str(prev->begin, prev->end));
    if (!prev || e.end > prev->end) prev = &e;
  }

  st->tensors.reserve(entries.size());
  for (auto& e : entries) {
    st->index.emplace(e.name, st->tensors.size());
    st->tensors.push_back(named_view{std::move(e.name), tensor_view(e.type, e.shape, data.data() + e.begin)});
  }
  return st;
}

}  // namespace

result<safetensors_file, load_error> safetensors_file::parse(std::span<const std::byte> bytes, std::string name) {
  auto st = parse_image(bytes, std::move(name));
  if (!st) return troupe::unexpected(std::move(st.error()));
  return safetensors_file(std::move(*st));
}

result<safetensors_file, load_error> safetensors_file::open(const std::filesystem::path& path) {
  auto mapping = detail::mapped_file::open(path);
  if (!mapping) return troupe::unexpected(std::move(mapping.error()));
  auto st = parse_image((*mapping)->bytes(), path.string());
  if (!st) return troupe::unexpected(std::move(st.error()));
  (*st)->mapping = std::move(*mapping);
  return safetensors_file(std::move(*st));
}

const std::string& safetensors_file::name() const { return state_->name; }
const std::vector<named_view>& safetensors_file::tensors() const { return state_->tensors; }
const string_map& safetensors_file::metadata() const { return state_->metadata; }
std::size_t safetensors_file::data_offset() const { return state_->data_offset; }

std::optional<tensor_view> safetensors_file::find(std::string_view name) const {
  const auto it = state_->index.find(name);
  if (it == state_->index.end()) return std::nullopt;
  return state_->tensors[it->second].view;
}

std::optional<tensor_view> safetensors_dir::find(std::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> safetensors_dir::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [n, v] : tensors_) out.push_back(n);
  return out;
}

std::size_t safetensors_dir::total_bytes() const {
  std::size_t n = 0;
  for (const auto& [name, v] : tensors_) n += v.bytes();
  return n;
}

namespace {

// A shard named by the index must sit in the checkpoint directory itself.
bool plain_file_name(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
         f.find('\0') == std::string::npos;
}

}  // namespace

result<safetensors_dir, load_error> open_safetensors_dir(const std::filesystem::path& dir) {
  const auto io_fail = [&](std::string reason) {
    return troupe::unexpected(load_error{load_error_code::io, dir.string(), "", std::move(reason)});
  };
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return io_fail("not a directory");
  const auto index_path = dir / "model.safetensors.index.json";
  const auto single_path = dir / "model.safetensors";

  safetensors_dir out;
  // Which shard each tensor must come from, when an index says so.
  std::vector<std::pair<std::string, std::string>> listed;
  std::vector<std::string> shard_files;
  if (std::filesystem::exists(index_path, ec)) {
    const std::string file = index_path.string();
    auto mapping = detail::mapped_file::open(index_path);
    if (!mapping) return troupe::unexpected(std::move(mapping.error()));
    const auto bytes = (*mapping)->bytes();
    auto doc = detail::parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), file);
    if (!doc) return troupe::unexpected(std::move(doc.error()));
    const auto fail = [&](load_error_code code, const std::string& item, std::string reason) {
      return troupe::unexpected(load_error{code, file, detail::printable(item), std::move(reason)});
    };
    if (!doc->is_object()) return fail(load_error_code::bad_header, "", "index is not a JSON object");
    const auto wm = doc->find("weight_map");
    if (wm == doc->end()) return fail(load_error_code::missing_key, "weight_map", "the index has no weight_map");
    if (!wm->is_object()) return fail(load_error_code::bad_header, "weight_map", "is not an object");
    std::set<std::string> seen;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string())
        return fail(load_error_code::bad_header, it.key(),
                    "weight_map value is " + std::string(detail::json_kind(it.value())) + ", expected a file name");
      const auto& f = it.value().get_ref<const std::string&>();
      if (!plain_file_name(f))
        return fail(load_error_code::bad_header, it.key(), "shard '" + detail::printable(f) + "' is not a plain file name");
      listed.emplace_back(it.key(), f);
      if (seen.insert(f).second) shard_files.push_back(f);
    }
  } else if (std::filesystem::exists(single_path, ec)) {
    shard_files.push_back("model.safetensors");
  } else {
    return io_fail("neither model.safetensors.index.json nor model.safetensors is there");
  }

  std::map<std::string, std::size_t> shard_of_file;
  for (const auto& f : shard_files) {
    auto shard = safetensors_file::open(dir / f);
    if (!shard) return troupe::unexpected(std::move(shard.error()));
    for (const auto& t : shard->tensors()) {
      if (!out.tensors_.emplace(t.name, t.view).second) {
        // Find the earlier shard for the message.
        std::string other;
        for (const auto& s : out.shards_)
          if (s.find(t.name)) other = s.name();
        return troupe::unexpected(load_error{load_error_code::duplicate_name, shard->name(),
                                             detail::printable(t.name), "tensor also stored in " + other});
      }
    }
    shard_of_file.emplace(f, out.shards_.size());
    out.shards_.push_back(std::move(*shard));
  }
  for (const auto& [tensor, f] : listed) {
    const auto& shard = out.shards_[shard_of_file.at(f)];
    if (!shard.find(tensor))
      return troupe::unexpected(load_error{load_error_code::missing_key, shard.name(), detail::printable(tensor),
                                           "listed in the index's weight_map but not stored in this shard"});
  }
  return out;
}

result<void, load_error> write_safetensors(const std::filesystem::path& path, std::span<const named_view> tensors,
                                           const string_map& metadata) {
  const std::string file = path.string();
  const auto fail = [&](load_error_code code, std::string_view item, std::string reason) {
    return troupe::unexpected(load_error{code, file, detail::printable(item), std::move(reason)});
  };
  // ordered_json keeps the header in the order the tensors are written.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header[std::string(metadata_key)] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) {
      if (!detail::valid_utf8(k)) return fail(load_error_code::non_utf8_key, k, "metadata key is not valid UTF-8");
      if (!detail::valid_utf8(v)) return fail(load_error_code::bad_metadata, k, "metadata value is not valid UTF-8");
      m[k] = v;
    }
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == metadata_key) return fail(load_error_code::bad_header, t.name, "the name is reserved for metadata");
    if (!detail::valid_utf8(t.name)) return fail(load_error_code::non_utf8_key, t.name, "tensor name is not valid UTF-8");
    if (!names.insert(t.name).second) return fail(load_error_code::duplicate_name, t.name, "tensor given twice");
    const auto code = info(t.view.type()).safetensors;
    if (!code)
      return fail(load_error_code::unknown_dtype, t.name,
                  "dtype " + std::string(name(t.view.type())) + " has no safetensors code");
    const auto numel = t.view.shape().checked_numel();
    const auto bytes = numel ? storage_bytes(t.view.type(), static_cast<std::uint64_t>(*numel)) : std::nullopt;
    if (!bytes) return fail(load_error_code::shape_overflow, t.name, "shape " + t.view.shape().str() + " is invalid");
    auto& e = header[t.name] = nlohmann::ordered_json::object();
    e["dtype"] = *code;
    auto shape = nlohmann::ordered_json::array();
    for (const auto d : t.view.shape().dims()) shape.push_back(d);
    e["shape"] = std::move(shape);
    e["data_offsets"] = {offset, offset + *bytes};
    offset += *bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return fail(load_error_code::bad_header, "", std::string("cannot encode the header: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  auto out = detail::file_writer::create(path);
  if (!out) return troupe::unexpected(std::move(out.error()));
  std::byte len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xff);
  out->write(len);
  out->write(std::as_bytes(std::span<const char>(text)));
  for (const auto& t : tensors) out->write(t.view.byte_span());
  return out->commit();
}

}  // namespace troupe::load

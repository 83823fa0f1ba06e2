#include "engine/load/weight_store.hpp"

#include <cstring>
#include <deque>
#include <fstream>
#include <map>

#include "engine/load/detail/mapped_file.hpp"
#include "engine/load/detail/spill_file.hpp"
#include "engine/load/safetensors.hpp"

namespace troupe::load {

std::string_view name(weight_format f) {
  switch (f) {
    case weight_format::safetensors: return "safetensors";
    case weight_format::gguf: return "gguf";
  }
  return "unknown";
}

struct weight_store::impl {
  weight_format format = weight_format::safetensors;
  std::filesystem::path path;
  // Whichever readers made the views below; they own the mappings.
  std::optional<gguf_file> gguf;
  std::vector<safetensors_file> shards;
  std::map<std::string, tensor_view, std::less<>> tensors;
  std::size_t total_bytes = 0;
  std::optional<hf_quant_config> quant;
  std::deque<tensor> owned;  // row forms kept in memory (no spill file), act-order permutations
  std::shared_ptr<const detail::mapped_file> spill;  // the quantized linears' row forms, mapped
  // The byte ranges of the file mappings (from each file's first tensor byte to its last).
  std::vector<std::pair<const std::byte*, const std::byte*>> mapped;
};

namespace {

// GGUF is told by its magic as well as its extension, so a renamed file still opens as what it is.
bool looks_like_gguf(const std::filesystem::path& path) {
  if (path.extension() == ".gguf") return true;
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  return in.read(m, 4) && std::memcmp(m, "GGUF", 4) == 0;
}

}  // namespace

result<weight_store, load_error> weight_store::open(const std::filesystem::path& path) {
  auto i = std::make_shared<impl>();
  i->path = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    auto dir = open_safetensors_dir(path);
    if (!dir) return troupe::unexpected(std::move(dir.error()));
    i->shards = dir->shards();
    for (const auto& s : i->shards)
      for (const auto& t : s.tensors()) i->tensors.emplace(t.name, t.view);
    auto q = read_hf_quant(path);
    if (!q) return troupe::unexpected(std::move(q.error()));
    i->quant = std::move(*q);
  } else if (looks_like_gguf(path)) {
    auto g = gguf_file::open(path);
    if (!g) return troupe::unexpected(std::move(g.error()));
    i->format = weight_format::gguf;
    for (const auto& t : g->tensors()) i->tensors.emplace(t.name, t.view);
    i->gguf = std::move(*g);
  } else {
    auto s = safetensors_file::open(path);
    if (!s) return troupe::unexpected(std::move(s.error()));
    for (const auto& t : s->tensors()) i->tensors.emplace(t.name, t.view);
    i->shards.push_back(std::move(*s));
  }
  for (const auto& [n, v] : i->tensors) i->total_bytes += v.bytes();
  auto span_of = [](const std::vector<named_view>& ts) {
    std::pair<const std::byte*, const std::byte*> r{nullptr, nullptr};
    for (const auto& t : ts) {
      if (t.view.bytes() == 0) continue;
      if (!r.first || t.view.data() < r.first) r.first = t.view.data();
      if (!r.second || t.view.data() + t.view.bytes() > r.second) r.second = t.view.data() + t.view.bytes();
    }
    return r;
  };
  if (i->gguf) i->mapped.push_back(span_of(i->gguf->tensors()));
  for (const auto& s : i->shards) i->mapped.push_back(span_of(s.tensors()));
  if (i->quant) {
    std::vector<std::string> names;
    for (const auto& [n, v] : i->tensors) names.push_back(n);
    auto lookup = [&](std::string_view n) -> std::optional<tensor_view> {
      const auto it = i->tensors.find(n);
      if (it == i->tensors.end()) return std::nullopt;
      return it->second;
    };
    // Each linear's row form goes to the spill file as soon as it is made (or stays in memory where
    // there is none, or the disk is full), and the stored bytes it was read from are dropped then, so
    // the load holds one linear at a time beside the file.
    auto spill = detail::spill_file::create();
    struct spilled {
      std::string name;
      dtype type;
      troupe::shape dims;
      std::size_t offset;
    };
    std::vector<spilled> in_spill;
    std::vector<std::pair<std::string, tensor_view>> made;
    std::vector<std::string> consumed;
    auto keep = [&](std::string name, tensor t) {
      i->owned.push_back(std::move(t));
      made.emplace_back(std::move(name), i->owned.back().view());
    };
    auto r = for_each_hf_quant(*i->quant, names, lookup, (path / "config.json").string(), [&](hf_quant_linear&& l) -> result<void, load_error> {
      for (const auto& c : l.consumed) {
        if (const auto it = i->tensors.find(c); it != i->tensors.end()) detail::release_pages(it->second.data(), it->second.bytes(), true);
        consumed.push_back(c);
      }
      std::optional<std::size_t> at;
      if (spill) at = spill->append(l.weight.view().byte_span());
      if (at) in_spill.push_back({l.weight_name, l.weight.type(), l.weight.shape(), *at});
      else keep(l.weight_name, std::move(l.weight));
      if (l.input_perm) keep(l.weight_name.substr(0, l.weight_name.size() - 7) + ".input_perm", std::move(*l.input_perm));
      return {};
    });
    if (!r) return troupe::unexpected(std::move(r.error()));
    for (const auto& c : consumed) i->tensors.erase(c);
    if (!in_spill.empty()) {
      auto m = spill->map();
      if (!m) return troupe::unexpected(std::move(m.error()));
      i->spill = std::move(*m);
      const std::byte* base = i->spill->bytes().data();
      for (const auto& s : in_spill) made.emplace_back(s.name, tensor_view(s.type, s.dims, base + s.offset));
      i->mapped.emplace_back(base, base + i->spill->bytes().size());
    }
    for (auto& [n, v] : made) i->tensors.insert_or_assign(n, v);
  }
  return weight_store(std::move(i));
}

weight_format weight_store::format() const { return impl_->format; }
const std::filesystem::path& weight_store::path() const { return impl_->path; }
std::size_t weight_store::size() const { return impl_->tensors.size(); }
std::size_t weight_store::total_bytes() const { return impl_->total_bytes; }

std::optional<tensor_view> weight_store::find(std::string_view name) const {
  const auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> weight_store::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->tensors.size());
  for (const auto& [n, v] : impl_->tensors) out.push_back(n);
  return out;
}

const std::optional<hf_quant_config>& weight_store::quantization() const { return impl_->quant; }

void weight_store::release_pages(const tensor_view& bytes, bool covering) const {
  const std::byte* b = bytes.data();
  const std::byte* e = b + bytes.bytes();
  for (const auto& [lo, hi] : impl_->mapped) {
    if (!lo || b < lo || e > hi) continue;
    if (!covering) return detail::release_pages(b, bytes.bytes(), false);
    // A fault on a small tensor may map the whole page-cache folio around it (up to 2 MiB, aligned to
    // its size), neighbours' bytes too: drop the aligned 2 MiB around the bytes, within the mapping.
    // Pages still read elsewhere fault back in from the cache.
    constexpr std::uintptr_t folio = std::uintptr_t{2} << 20;
    const auto from = std::max(reinterpret_cast<std::uintptr_t>(lo), reinterpret_cast<std::uintptr_t>(b) & ~(folio - 1));
    const auto to = std::min(reinterpret_cast<std::uintptr_t>(hi), (reinterpret_cast<std::uintptr_t>(e) + folio - 1) & ~(folio - 1));
    return detail::release_pages(reinterpret_cast<const std::byte*>(from), to - from, true);
  }
}

bool weight_store::file_backed(const tensor_view& bytes) const {
  const std::byte* b = bytes.data();
  const std::byte* e = b + bytes.bytes();
  for (const auto& [lo, hi] : impl_->mapped)
    if (lo && b >= lo && e <= hi) return true;
  return false;
}

std::optional<std::reference_wrapper<const gguf_file>> weight_store::gguf() const {
  if (!impl_->gguf) return std::nullopt;
  return std::cref(*impl_->gguf);
}

}  // namespace troupe::load

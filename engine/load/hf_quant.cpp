#include "engine/load/hf_quant.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/half.hpp"

namespace troupe::load {

std::string_view name(hf_quant_method m) {
  switch (m) {
    case hf_quant_method::gptq: return "gptq";
    case hf_quant_method::awq: return "awq";
    case hf_quant_method::fp8: return "fp8";
    case hf_quant_method::compressed_tensors: return "compressed-tensors";
  }
  return "unknown";
}

std::string hf_quant_config::summary() const {
  std::string s(name(method));
  if (!format.empty()) s += " " + format;
  s += float_codes ? ", fp8 e4m3" : ", " + std::to_string(bits) + "-bit";
  if (group_size > 0) s += ", group " + std::to_string(group_size);
  if (group_size < 0) s += ", per channel";
  if (block.size() == 2) s += ", block " + std::to_string(block[0]) + "x" + std::to_string(block[1]);
  if (act_order) s += ", act-order";
  if (!float_codes) s += symmetric ? ", symmetric" : ", with zero points";
  if (zero_minus_one) s += " (v1 zeros)";
  if (static_activations) s += ", static activation scales (unused)";
  return s;
}

namespace {

using json = nlohmann::json;

load_error unsupported(const std::string& file, std::string field, std::string reason) {
  return load_error{load_error_code::unsupported_quantization, file, std::move(field), std::move(reason)};
}
load_error malformed(const std::string& file, std::string item, std::string reason) {
  return load_error{load_error_code::bad_quantization, file, std::move(item), std::move(reason)};
}

// A JSON field of an expected kind, or the refusal naming it.
struct fields {
  const json& j;
  const std::string& file;
  std::string path;  // "quantization_config"
  std::string at(std::string_view k) const { return path + "." + std::string(k); }
  bool has(std::string_view k) const { return j.contains(k) && !j.at(std::string(k)).is_null(); }
  result<std::int64_t, load_error> integer(std::string_view k, std::int64_t fallback) const {
    if (!has(k)) return fallback;
    const auto& v = j.at(std::string(k));
    if (!v.is_number_integer()) return unexpected(malformed(file, at(k), "expected an integer, got " + v.dump()));
    return v.get<std::int64_t>();
  }
  result<bool, load_error> boolean(std::string_view k, bool fallback) const {
    if (!has(k)) return fallback;
    const auto& v = j.at(std::string(k));
    if (!v.is_boolean()) return unexpected(malformed(file, at(k), "expected true or false, got " + v.dump()));
    return v.get<bool>();
  }
  result<std::string, load_error> string(std::string_view k, std::string fallback) const {
    if (!has(k)) return fallback;
    const auto& v = j.at(std::string(k));
    if (!v.is_string()) return unexpected(malformed(file, at(k), "expected a string, got " + v.dump()));
    return v.get<std::string>();
  }
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

#define TRY_ASSIGN(var, expr)                            \
  auto var##_r = (expr);                                 \
  if (!var##_r) return unexpected(std::move(var##_r.error())); \
  auto var = *var##_r

result<hf_quant_config, load_error> parse_gptq(const fields& f) {
  hf_quant_config c;
  c.method = hf_quant_method::gptq;
  TRY_ASSIGN(bits, f.integer("bits", 4));
  if (bits != 2 && bits != 3 && bits != 4 && bits != 8)
    return unexpected(unsupported(f.file, f.at("bits"), "GPTQ codes of " + std::to_string(bits) + " bits (2, 3, 4 and 8 are read)"));
  c.bits = static_cast<int>(bits);
  TRY_ASSIGN(group, f.integer("group_size", 0));
  if (group == 0 || group < -1) return unexpected(malformed(f.file, f.at("group_size"), "a group of " + std::to_string(group)));
  c.group_size = group;
  TRY_ASSIGN(desc, f.boolean("desc_act", false));
  c.act_order = desc;
  TRY_ASSIGN(sym, f.boolean("sym", true));
  c.symmetric = sym;
  // AutoGPTQ writes checkpoint_format; GPTQModel writes format too. v1 ("gptq") stores zero points less one.
  TRY_ASSIGN(fmt1, f.string("checkpoint_format", ""));
  TRY_ASSIGN(fmt2, f.string("format", ""));
  const std::string fmt = lower(!fmt1.empty() ? fmt1 : fmt2);
  const std::string field = !fmt1.empty() ? "checkpoint_format" : "format";
  if (fmt.empty() || fmt == "gptq") {
    c.zero_minus_one = true;
  } else if (fmt == "gptq_v2") {
    c.zero_minus_one = false;
  } else {
    return unexpected(unsupported(f.file, f.at(field), "the GPTQ checkpoint format '" + fmt + "' (gptq and gptq_v2 are read)"));
  }
  TRY_ASSIGN(pack, f.string("pack_dtype", "int32"));
  if (lower(pack) != "int32" && lower(pack) != "torch.int32")
    return unexpected(unsupported(f.file, f.at("pack_dtype"), "codes packed in " + pack + " (int32 is read)"));
  return c;
}

result<hf_quant_config, load_error> parse_awq(const fields& f) {
  hf_quant_config c;
  c.method = hf_quant_method::awq;
  TRY_ASSIGN(bits, f.integer("bits", f.has("w_bit") ? 0 : 4));
  if (bits == 0) {
    TRY_ASSIGN(w, f.integer("w_bit", 4));
    bits = w;
  }
  if (bits != 4) return unexpected(unsupported(f.file, f.at("bits"), "AWQ codes of " + std::to_string(bits) + " bits (4 is read)"));
  c.bits = 4;
  TRY_ASSIGN(group, f.integer("group_size", f.has("q_group_size") ? 0 : 128));
  if (group == 0) {
    TRY_ASSIGN(g, f.integer("q_group_size", 128));
    group = g;
  }
  if (group == 0 || group < -1) return unexpected(malformed(f.file, f.at("group_size"), "a group of " + std::to_string(group)));
  c.group_size = group;
  TRY_ASSIGN(version, f.string("version", "gemm"));
  if (lower(version) != "gemm")
    return unexpected(unsupported(f.file, f.at("version"), "AWQ's '" + version + "' packing (gemm is read)"));
  TRY_ASSIGN(zero, f.boolean("zero_point", true));
  if (!zero) return unexpected(unsupported(f.file, f.at("zero_point"), "AWQ without zero points (AutoAWQ's GEMM packing stores them)"));
  c.symmetric = false;
  return c;
}

result<std::vector<std::int64_t>, load_error> block_sizes(const fields& f, std::string_view k) {
  if (!f.has(k)) return std::vector<std::int64_t>{};
  const auto& v = f.j.at(std::string(k));
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() || v[0].get<std::int64_t>() <= 0 ||
      v[1].get<std::int64_t>() <= 0)
    return unexpected(malformed(f.file, f.at(k), "expected two positive integers, got " + v.dump()));
  return std::vector<std::int64_t>{v[0].get<std::int64_t>(), v[1].get<std::int64_t>()};
}

result<hf_quant_config, load_error> parse_fp8(const fields& f, bool fbgemm) {
  hf_quant_config c;
  c.method = hf_quant_method::fp8;
  c.float_codes = true;
  c.bits = 8;
  TRY_ASSIGN(fmt, f.string("fmt", "e4m3"));
  if (lower(fmt) != "e4m3") return unexpected(unsupported(f.file, f.at("fmt"), "FP8 weights in " + fmt + " (e4m3 is read)"));
  TRY_ASSIGN(scheme, f.string("activation_scheme", "dynamic"));
  if (scheme != "dynamic" && scheme != "static")
    return unexpected(unsupported(f.file, f.at("activation_scheme"), "the activation scheme '" + scheme + "'"));
  c.static_activations = scheme == "static";
  TRY_ASSIGN(block, block_sizes(f, "weight_block_size"));
  c.block = block;
  if (fbgemm) c.format = "fbgemm";
  return c;
}

result<hf_quant_config, load_error> parse_compressed_tensors(const fields& f) {
  hf_quant_config c;
  c.method = hf_quant_method::compressed_tensors;
  TRY_ASSIGN(format, f.string("format", ""));
  c.format = format;
  if (format != "pack-quantized" && format != "int-quantized" && format != "naive-quantized" && format != "float-quantized")
    return unexpected(unsupported(f.file, f.at("format"),
                                  "the compressed-tensors format '" + format + "' (pack-quantized, int-quantized, naive-quantized and float-quantized are read)"));
  if (f.has("sparsity_config")) {
    const auto& sp = f.j.at("sparsity_config");
    if (sp.is_object() && sp.contains("format") && sp["format"].is_string() && sp["format"].get<std::string>() != "dense")
      return unexpected(unsupported(f.file, f.at("sparsity_config.format"), "sparse weights (" + sp["format"].get<std::string>() + ")"));
  }
  if (!f.has("config_groups") || !f.j.at("config_groups").is_object() || f.j.at("config_groups").empty())
    return unexpected(malformed(f.file, f.at("config_groups"), "no quantization scheme"));
  bool first = true;
  for (const auto& [gname, group] : f.j.at("config_groups").items()) {
    const std::string at = f.path + ".config_groups." + gname + ".weights";
    if (!group.is_object() || !group.contains("weights") || !group["weights"].is_object())
      return unexpected(malformed(f.file, at, "no weight arguments"));
    const fields w{group["weights"], f.file, at};
    TRY_ASSIGN(bits, w.integer("num_bits", 8));
    TRY_ASSIGN(type, w.string("type", "int"));
    TRY_ASSIGN(strategy, w.string("strategy", ""));
    TRY_ASSIGN(sym, w.boolean("symmetric", true));
    TRY_ASSIGN(dynamic, w.boolean("dynamic", false));
    TRY_ASSIGN(actorder, w.string("actorder", ""));
    TRY_ASSIGN(block, block_sizes(w, "block_structure"));
    if (dynamic) return unexpected(unsupported(f.file, w.at("dynamic"), "weights quantized at run time"));
    if (type != "int" && type != "float") return unexpected(unsupported(f.file, w.at("type"), "codes of type '" + type + "'"));
    const bool is_float = type == "float";
    if (is_float && bits != 8) return unexpected(unsupported(f.file, w.at("num_bits"), "float codes of " + std::to_string(bits) + " bits (8, E4M3, is read)"));
    if (!is_float && !(bits >= 2 && bits <= 4) && bits != 8)
      return unexpected(unsupported(f.file, w.at("num_bits"), "integer codes of " + std::to_string(bits) + " bits (2 to 4 and 8 are read)"));
    if (!strategy.empty() && strategy != "tensor" && strategy != "channel" && strategy != "group" && strategy != "block")
      return unexpected(unsupported(f.file, w.at("strategy"), "the '" + strategy + "' strategy (tensor, channel, group and block are read)"));
    if (!first && (c.bits != bits || c.float_codes != is_float || c.symmetric != sym))
      return unexpected(unsupported(f.file, at, "schemes of different code types in one checkpoint"));
    first = false;
    c.bits = static_cast<int>(bits);
    c.float_codes = is_float;
    c.symmetric = sym;
    c.act_order = c.act_order || actorder == "group";
    if (!block.empty()) c.block = block;
    if (is_float && format != "float-quantized" && format != "naive-quantized")
      return unexpected(unsupported(f.file, f.at("format"), "float codes in the '" + format + "' format"));
    if (!is_float && format == "float-quantized")
      return unexpected(unsupported(f.file, f.at("format"), "integer codes in the float-quantized format"));
  }
  return c;
}

result<json, load_error> parse_json(std::string_view text, const std::string& file) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return unexpected(load_error{load_error_code::bad_header, file, "", std::string("not JSON: ") + e.what()});
  }
}

}  // namespace

result<std::optional<hf_quant_config>, load_error> parse_hf_quant(std::string_view config_json, std::string_view quantize_config_json,
                                                                  const std::string& file) {
  json q;
  std::string path = "quantization_config";
  std::string where = file;
  if (!config_json.empty()) {
    TRY_ASSIGN(c, parse_json(config_json, file));
    if (c.is_object() && c.contains("quantization_config") && !c["quantization_config"].is_null()) q = c["quantization_config"];
  }
  if (q.is_null() && !quantize_config_json.empty()) {
    where = "quantize_config.json";
    TRY_ASSIGN(c, parse_json(quantize_config_json, where));
    q = std::move(c);
    path = "quantize_config";
    if (q.is_object() && !q.contains("quant_method")) q["quant_method"] = "gptq";  // AutoGPTQ's file is GPTQ's
  }
  if (q.is_null()) return std::optional<hf_quant_config>{};
  if (!q.is_object()) return unexpected(malformed(where, path, "expected an object, got " + q.dump()));
  const fields f{q, where, path};
  TRY_ASSIGN(method, f.string("quant_method", ""));
  const std::string m = lower(method);
  result<hf_quant_config, load_error> c = unexpected(load_error{});
  if (m == "gptq") c = parse_gptq(f);
  else if (m == "awq") c = parse_awq(f);
  else if (m == "fp8") c = parse_fp8(f, false);
  else if (m == "fbgemm_fp8") c = parse_fp8(f, true);
  else if (m == "compressed-tensors" || m == "compressed_tensors") c = parse_compressed_tensors(f);
  else
    return unexpected(unsupported(where, f.at("quant_method"),
                                  "the quantization method '" + method + "' (gptq, awq, fp8, fbgemm_fp8 and compressed-tensors are read)"));
  if (!c) return unexpected(std::move(c.error()));
  return std::optional<hf_quant_config>{std::move(*c)};
}

result<std::optional<hf_quant_config>, load_error> read_hf_quant(const std::filesystem::path& dir) {
  auto slurp = [](const std::filesystem::path& p) -> std::optional<std::string> {
    std::ifstream in(p, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  const auto config = slurp(dir / "config.json");
  const auto qc = slurp(dir / "quantize_config.json");
  if (!config && !qc) return std::optional<hf_quant_config>{};
  return parse_hf_quant(config.value_or(""), qc.value_or(""), (dir / "config.json").string());
}

// ---------------------------------------------------------------------------------------------
// Conversion.

namespace {

std::uint32_t word_at(const tensor_view& v, std::int64_t i) {
  std::uint32_t w;
  std::memcpy(&w, v.data() + 4 * static_cast<std::size_t>(i), 4);
  return w;
}

// Value j (bits wide) of a little-endian bit stream of 32-bit words word(0), word(1), ...
template <class Word>
std::uint32_t stream_at(const Word& word, std::int64_t j, int bits) {
  const std::int64_t pos = j * bits;
  const std::int64_t w = pos / 32;
  const int shift = static_cast<int>(pos % 32);
  std::uint64_t v = word(w) >> shift;
  if (shift + bits > 32) v |= static_cast<std::uint64_t>(word(w + 1)) << (32 - shift);
  return static_cast<std::uint32_t>(v & ((1u << bits) - 1u));
}

// Value j of words that each hold 32 / bits values from the low bits up (compressed-tensors' packing).
template <class Word>
std::uint32_t packed_at(const Word& word, std::int64_t j, int bits) {
  const int per = 32 / bits;
  return (word(j / per) >> (bits * static_cast<int>(j % per))) & ((1u << bits) - 1u);
}

// A scale tensor as a grid over the [N, K] weight: scale(n, k) = S[n / bn][k / bk] (`transposed`:
// stored [K-groups, N], GPTQ's and AWQ's).
struct scale_grid {
  tensor_view v;
  std::int64_t rows = 1, cols = 1;  // of the grid
  std::int64_t bn = 1, bk = 1;
  bool transposed = false;
  float at(std::int64_t n, std::int64_t k) const {
    const std::int64_t r = n / bn, c = k / bk;
    const std::int64_t i = transposed ? c * rows + r : r * cols + c;
    return static_cast<float>(load_element(v.type(), v.data(), i));
  }
};

bool float_scale(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The grid of `s` over an [N, K] weight: a single value, one per row ([N] or [N, 1]), or [R, C] blocks
// of ceil(N / R) x ceil(K / C) (or `block` when the config gives it). Column blocks must be whole
// 32-blocks (or span K).
result<scale_grid, load_error> grid_of(const tensor_view& s, const std::string& name, std::int64_t N, std::int64_t K,
                                       const std::vector<std::int64_t>& block, bool transposed, const std::string& file) {
  if (!float_scale(s.type()))
    return unexpected(malformed(file, name, "scales stored as " + std::string(troupe::name(s.type())) + " (f32, f16 or bf16 expected)"));
  scale_grid g;
  g.v = s;
  g.transposed = transposed;
  const auto& d = s.shape();
  if (s.numel() == 1) {
    g.bn = N, g.bk = K;
  } else if (d.rank() == 1 && d[0] == N) {
    g.rows = N, g.bk = K;
  } else if (d.rank() == 2) {
    g.rows = transposed ? d[1] : d[0];
    g.cols = transposed ? d[0] : d[1];
    g.bn = block.size() == 2 && g.rows > 1 ? block[0] : ceil_div(N, g.rows);
    g.bk = block.size() == 2 && g.cols > 1 ? block[1] : ceil_div(K, g.cols);
    if (g.rows == N) g.bn = 1;
    if (g.cols == 1) g.bk = K;
    if (ceil_div(N, g.bn) != g.rows || ceil_div(K, g.bk) != g.cols)
      return unexpected(malformed(file, name, "scales " + d.str() + " do not tile a weight [" + std::to_string(N) + ", " + std::to_string(K) +
                                                  "] in blocks of " + std::to_string(g.bn) + " x " + std::to_string(g.bk)));
  } else {
    return unexpected(malformed(file, name, "scales of shape " + d.str() + " for a weight [" + std::to_string(N) + ", " + std::to_string(K) + "]"));
  }
  if (g.bk != K && g.bk % 32 != 0)
    return unexpected(unsupported(file, name, "scale blocks of " + std::to_string(g.bk) + " columns (whole multiples of 32 are read)"));
  return g;
}

// Writes the affine blocks of an [N, K] integer weight: codes code(n, k), the zero zero(n, k) and the
// scale scale(n, k) of column k's group (constant across each 32-block of columns taken in the order
// `perm`, when given). 2 to 4 bits: q4_a32, whose f16 scale must hold the stored one exactly; 8 bits:
// q8_a32.
template <class Code, class Zero, class Scale>
result<tensor, load_error> affine_weight(std::int64_t N, std::int64_t K, int bits, const std::vector<std::int32_t>* perm,
                                         const Code& code, const Zero& zero, const Scale& scale, const std::string& name,
                                         const std::string& file) {
  const bool wide = bits > 4;
  tensor out(wide ? dtype::q8_a32 : dtype::q4_a32, troupe::shape{N, K});
  const std::size_t block_bytes = info(out.type()).block_bytes;
  const std::int64_t blocks = K / 32;
  std::byte* dst = out.data();
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t b = 0; b < blocks; ++b, dst += block_bytes) {
      auto col = [&](int j) -> std::int64_t { return perm ? (*perm)[static_cast<std::size_t>(32 * b + j)] : 32 * b + j; };
      const std::int64_t k0 = col(0);
      const float d = scale(n, k0);
      const std::uint32_t z = zero(n, k0);
      if (z > 255) return unexpected(malformed(file, name, "a zero point of " + std::to_string(z)));
      if (wide) {
        std::memcpy(dst, &d, 4);
        dst[4] = static_cast<std::byte>(z);
        for (int j = 0; j < 32; ++j) dst[8 + j] = static_cast<std::byte>(code(n, col(j)));
      } else {
        const std::uint16_t h = f32_to_f16(d);
        if (f16_to_f32(h) != d && !(std::isnan(d)))
          return unexpected(unsupported(file, name, "a scale of " + std::to_string(d) + " that f16 does not hold exactly (row " + std::to_string(n) + ")"));
        dst[0] = static_cast<std::byte>(h & 0xff);
        dst[1] = static_cast<std::byte>(h >> 8);
        dst[2] = static_cast<std::byte>(z);
        for (int j = 0; j < 16; ++j) dst[4 + j] = static_cast<std::byte>(code(n, col(j)) | (code(n, col(j + 16)) << 4));
      }
    }
  }
  return out;
}

// The act-order permutation: columns sorted (stably) by group, or none when g_idx is already k / group.
// Each group must then fill whole 32-blocks.
result<std::optional<std::vector<std::int32_t>>, load_error> order_of(const tensor_view& g_idx, std::int64_t K, std::int64_t groups,
                                                                      std::int64_t group, const std::string& name, const std::string& file) {
  if (g_idx.type() != dtype::i32 && g_idx.type() != dtype::i64)
    return unexpected(malformed(file, name, "g_idx stored as " + std::string(troupe::name(g_idx.type()))));
  if (g_idx.numel() != K) return unexpected(malformed(file, name, "g_idx of " + std::to_string(g_idx.numel()) + " entries for " + std::to_string(K) + " columns"));
  std::vector<std::int64_t> g(static_cast<std::size_t>(K));
  bool trivial = true, unset = true;
  for (std::int64_t k = 0; k < K; ++k) {
    g[static_cast<std::size_t>(k)] = static_cast<std::int64_t>(load_element(g_idx.type(), g_idx.data(), k));
    unset = unset && g[static_cast<std::size_t>(k)] == -1;
    trivial = trivial && g[static_cast<std::size_t>(k)] == k / group;
  }
  if (trivial || unset) return std::optional<std::vector<std::int32_t>>{};
  for (std::int64_t k = 0; k < K; ++k)
    if (g[static_cast<std::size_t>(k)] < 0 || g[static_cast<std::size_t>(k)] >= groups)
      return unexpected(malformed(file, name, "g_idx[" + std::to_string(k) + "] = " + std::to_string(g[static_cast<std::size_t>(k)]) + " outside " +
                                                  std::to_string(groups) + " groups"));
  std::vector<std::int32_t> perm(static_cast<std::size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](std::int32_t a, std::int32_t b) { return g[static_cast<std::size_t>(a)] < g[static_cast<std::size_t>(b)]; });
  for (std::int64_t j = 0; j < K; j += 32)
    for (std::int64_t t = 1; t < 32; ++t)
      if (g[static_cast<std::size_t>(perm[static_cast<std::size_t>(j + t)])] != g[static_cast<std::size_t>(perm[static_cast<std::size_t>(j)])])
        return unexpected(unsupported(file, name, "act-order groups that are not whole 32-column blocks"));
  return std::optional<std::vector<std::int32_t>>{std::move(perm)};
}

tensor perm_tensor(const std::vector<std::int32_t>& perm) {
  tensor t(dtype::i32, troupe::shape{static_cast<std::int64_t>(perm.size())});
  std::memcpy(t.data(), perm.data(), perm.size() * 4);
  return t;
}

struct context {
  const hf_quant_config& c;
  const tensor_lookup& find;
  const std::string& file;
  result<tensor_view, load_error> need(const std::string& name) const {
    auto v = find(name);
    if (!v) return unexpected(malformed(file, name, "missing"));
    return *v;
  }
};

std::string strip(const std::string& name, std::string_view suffix) { return name.substr(0, name.size() - suffix.size()); }

// GPTQ: qweight i32 [K bits / 32, N] (each column a bit stream along K), qzeros i32 [G, N bits / 32]
// (each row a bit stream along N), scales [G, N], g_idx [K].
result<hf_quant_linear, load_error> convert_gptq(const context& x, const std::string& p) {
  const int bits = x.c.bits;
  TRY_ASSIGN(qw, x.need(p + ".qweight"));
  TRY_ASSIGN(sc, x.need(p + ".scales"));
  if (qw.type() != dtype::i32 || qw.shape().rank() != 2) return unexpected(malformed(x.file, p + ".qweight", "expected i32 [K * bits / 32, N]"));
  const std::int64_t N = qw.shape()[1];
  if (qw.shape()[0] * 32 % bits != 0) return unexpected(malformed(x.file, p + ".qweight", "rows that are not whole values"));
  const std::int64_t K = qw.shape()[0] * 32 / bits;
  if (K % 32 != 0) return unexpected(unsupported(x.file, p + ".qweight", "K = " + std::to_string(K) + " (whole 32-blocks are read)"));
  if (sc.shape().rank() != 2 || sc.shape()[1] != N) return unexpected(malformed(x.file, p + ".scales", "scales " + sc.shape().str() + " for N = " + std::to_string(N)));
  const std::int64_t G = sc.shape()[0];
  const std::int64_t group = x.c.group_size > 0 ? x.c.group_size : (x.c.group_size == -1 ? K : ceil_div(K, G));
  if (ceil_div(K, group) != G) return unexpected(malformed(x.file, p + ".scales", std::to_string(G) + " groups for K = " + std::to_string(K) + " in groups of " + std::to_string(group)));
  if (!float_scale(sc.type())) return unexpected(malformed(x.file, p + ".scales", "scales stored as " + std::string(name(sc.type()))));
  auto qz = x.find(p + ".qzeros");
  if (qz && (qz->type() != dtype::i32 || qz->shape().rank() != 2 || qz->shape()[0] != G || qz->shape()[1] * 32 < N * bits))
    return unexpected(malformed(x.file, p + ".qzeros", "expected i32 [" + std::to_string(G) + ", N * bits / 32], got " + qz->shape().str()));
  hf_quant_linear out;
  out.weight_name = p + ".weight";
  out.consumed = {p + ".qweight", p + ".scales"};
  if (qz) out.consumed.push_back(p + ".qzeros");
  std::optional<std::vector<std::int32_t>> perm;
  if (auto gi = x.find(p + ".g_idx")) {
    out.consumed.push_back(p + ".g_idx");
    TRY_ASSIGN(o, order_of(*gi, K, G, group, p + ".g_idx", x.file));
    perm = std::move(o);
  }
  if (!perm && group % 32 != 0 && group != K)
    return unexpected(unsupported(x.file, p + ".scales", "groups of " + std::to_string(group) + " columns (whole multiples of 32 are read)"));
  std::vector<std::int64_t> gidx(static_cast<std::size_t>(K));
  if (auto gi = x.find(p + ".g_idx"); gi && perm)
    for (std::int64_t k = 0; k < K; ++k) gidx[static_cast<std::size_t>(k)] = static_cast<std::int64_t>(load_element(gi->type(), gi->data(), k));
  else
    for (std::int64_t k = 0; k < K; ++k) gidx[static_cast<std::size_t>(k)] = k / group;
  const std::uint32_t mask = (1u << bits) - 1u;
  const std::int64_t zwords = qz ? qz->shape()[1] : 0;
  auto code = [&](std::int64_t n, std::int64_t k) {
    return stream_at([&](std::int64_t w) { return word_at(qw, w * N + n); }, k, bits);
  };
  auto zero = [&](std::int64_t n, std::int64_t k) -> std::uint32_t {
    const std::int64_t g = gidx[static_cast<std::size_t>(k)];
    if (!qz) return 1u << (bits - 1);
    const std::uint32_t z = stream_at([&](std::int64_t w) { return w < zwords ? word_at(*qz, g * zwords + w) : 0u; }, n, bits);
    return x.c.zero_minus_one ? (z + 1u) & mask : z;
  };
  auto scale = [&](std::int64_t n, std::int64_t k) {
    return static_cast<float>(load_element(sc.type(), sc.data(), gidx[static_cast<std::size_t>(k)] * N + n));
  };
  TRY_ASSIGN(w, affine_weight(N, K, bits, perm ? &*perm : nullptr, code, zero, scale, p + ".scales", x.file));
  out.weight = std::move(w);
  if (perm) out.input_perm = perm_tensor(*perm);
  return out;
}

// AWQ (GEMM): qweight i32 [K, N / 8], nibble i of word c holding column 8c + {0,2,4,6,1,3,5,7}[i];
// qzeros i32 [G, N / 8] the same way; scales [G, N].
result<hf_quant_linear, load_error> convert_awq(const context& x, const std::string& p) {
  TRY_ASSIGN(qw, x.need(p + ".qweight"));
  TRY_ASSIGN(qz, x.need(p + ".qzeros"));
  TRY_ASSIGN(sc, x.need(p + ".scales"));
  if (qw.type() != dtype::i32 || qw.shape().rank() != 2) return unexpected(malformed(x.file, p + ".qweight", "expected i32 [K, N / 8]"));
  const std::int64_t K = qw.shape()[0], N = qw.shape()[1] * 8;
  if (K % 32 != 0) return unexpected(unsupported(x.file, p + ".qweight", "K = " + std::to_string(K) + " (whole 32-blocks are read)"));
  if (sc.shape().rank() != 2 || sc.shape()[1] != N || !float_scale(sc.type()))
    return unexpected(malformed(x.file, p + ".scales", "scales " + std::string(name(sc.type())) + sc.shape().str() + " for N = " + std::to_string(N)));
  const std::int64_t G = sc.shape()[0];
  const std::int64_t group = x.c.group_size > 0 ? x.c.group_size : K;
  if (ceil_div(K, group) != G) return unexpected(malformed(x.file, p + ".scales", std::to_string(G) + " groups for K = " + std::to_string(K)));
  if (group % 32 != 0 && group != K) return unexpected(unsupported(x.file, p + ".scales", "groups of " + std::to_string(group) + " columns"));
  if (qz.type() != dtype::i32 || qz.shape() != troupe::shape{G, N / 8})
    return unexpected(malformed(x.file, p + ".qzeros", "expected i32 [" + std::to_string(G) + ", " + std::to_string(N / 8) + "], got " + qz.shape().str()));
  static constexpr int nibble_of[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  auto code = [&](std::int64_t n, std::int64_t k) { return (word_at(qw, k * (N / 8) + n / 8) >> (4 * nibble_of[n % 8])) & 15u; };
  auto zero = [&](std::int64_t n, std::int64_t k) { return (word_at(qz, k / group * (N / 8) + n / 8) >> (4 * nibble_of[n % 8])) & 15u; };
  auto scale = [&](std::int64_t n, std::int64_t k) { return static_cast<float>(load_element(sc.type(), sc.data(), k / group * N + n)); };
  hf_quant_linear out;
  out.weight_name = p + ".weight";
  out.consumed = {p + ".qweight", p + ".qzeros", p + ".scales"};
  TRY_ASSIGN(w, affine_weight(N, K, 4, nullptr, code, zero, scale, p + ".scales", x.file));
  out.weight = std::move(w);
  return out;
}

// compressed-tensors, integer codes: weight_packed i32 [N, ceil(K / (32 / bits))] of offset codes
// (q + 2^(bits-1)), or an int8 weight of the signed codes; weight_scale [N, G] (or per channel, per
// tensor, per block); weight_zero_point (asymmetric): i32 packed along N [ceil(N / (32 / bits)), G] of
// offset zeros, or int8 [N, G] signed; weight_g_idx [K] for actorder "group".
result<hf_quant_linear, load_error> convert_ct_int(const context& x, const std::string& p, bool packed) {
  const int bits = x.c.bits;
  const std::uint32_t offset = 1u << (bits - 1);
  hf_quant_linear out;
  out.weight_name = p + ".weight";
  std::int64_t N = 0, K = 0;
  tensor_view wv;
  if (packed) {
    TRY_ASSIGN(wp, x.need(p + ".weight_packed"));
    TRY_ASSIGN(ws, x.need(p + ".weight_shape"));
    if (!is_integer(ws.type()) || ws.numel() != 2 || ws.type() == dtype::boolean)
      return unexpected(malformed(x.file, p + ".weight_shape", "expected two integers"));
    N = static_cast<std::int64_t>(load_element(ws.type(), ws.data(), 0));
    K = static_cast<std::int64_t>(load_element(ws.type(), ws.data(), 1));
    const int per = 32 / bits;
    if (wp.type() != dtype::i32 || wp.shape() != troupe::shape{N, ceil_div(K, per)})
      return unexpected(malformed(x.file, p + ".weight_packed", "expected i32 [" + std::to_string(N) + ", " + std::to_string(ceil_div(K, per)) + "], got " +
                                                                    std::string(name(wp.type())) + wp.shape().str()));
    wv = wp;
    out.consumed = {p + ".weight_packed", p + ".weight_shape"};
  } else {
    TRY_ASSIGN(w, x.need(p + ".weight"));
    if (w.type() != dtype::i8 || w.shape().rank() != 2) return unexpected(malformed(x.file, p + ".weight", "expected i8 [N, K]"));
    N = w.shape()[0], K = w.shape()[1];
    wv = w;
    out.consumed = {p + ".weight"};
  }
  if (N <= 0 || K % 32 != 0) return unexpected(unsupported(x.file, p + ".weight", "a weight [" + std::to_string(N) + ", " + std::to_string(K) + "] (K whole 32-blocks is read)"));
  TRY_ASSIGN(sc, x.need(p + ".weight_scale"));
  out.consumed.push_back(p + ".weight_scale");
  TRY_ASSIGN(grid, grid_of(sc, p + ".weight_scale", N, K, x.c.block, false, x.file));
  std::optional<std::vector<std::int32_t>> perm;
  std::vector<std::int64_t> gcol;  // act-order: the group of each column
  if (auto gi = x.find(p + ".weight_g_idx")) {
    out.consumed.push_back(p + ".weight_g_idx");
    TRY_ASSIGN(o, order_of(*gi, K, grid.cols, grid.bk, p + ".weight_g_idx", x.file));
    perm = std::move(o);
    if (perm) {
      if (grid.bn != 1 && grid.rows != 1) return unexpected(unsupported(x.file, p + ".weight_g_idx", "act-order with block scales"));
      gcol.resize(static_cast<std::size_t>(K));
      for (std::int64_t k = 0; k < K; ++k) gcol[static_cast<std::size_t>(k)] = static_cast<std::int64_t>(load_element(gi->type(), gi->data(), k));
    }
  }
  auto group_col = [&](std::int64_t k) { return perm ? gcol[static_cast<std::size_t>(k)] * grid.bk : k; };  // a column of k's group
  auto zp = x.find(p + ".weight_zero_point");
  if (zp) out.consumed.push_back(p + ".weight_zero_point");
  if (!x.c.symmetric && !zp) return unexpected(malformed(x.file, p + ".weight_zero_point", "missing for an asymmetric scheme"));
  const bool zp_packed = zp && zp->type() == dtype::i32 && bits < 8;
  if (zp && !zp_packed && zp->type() != dtype::i8 && zp->type() != dtype::i32)
    return unexpected(malformed(x.file, p + ".weight_zero_point", "zero points stored as " + std::string(name(zp->type()))));
  const std::int64_t zcols = grid.cols;
  if (zp && !zp_packed && zp->numel() != grid.rows * grid.cols)
    return unexpected(malformed(x.file, p + ".weight_zero_point", "zero points " + zp->shape().str() + " for scales " + sc.shape().str()));
  if (zp_packed && (zp->shape().rank() != 2 || zp->shape()[1] != zcols || zp->shape()[0] * (32 / bits) < grid.rows))
    return unexpected(malformed(x.file, p + ".weight_zero_point", "packed zero points " + zp->shape().str() + " for scales " + sc.shape().str()));
  auto code = [&](std::int64_t n, std::int64_t k) -> std::uint32_t {
    if (packed) return packed_at([&](std::int64_t w) { return word_at(wv, n * wv.shape()[1] + w); }, k, bits);
    return static_cast<std::uint32_t>(static_cast<std::int32_t>(static_cast<std::int8_t>(wv.data()[n * K + k])) + static_cast<std::int32_t>(offset)) & ((1u << bits) - 1u);
  };
  auto zero = [&](std::int64_t n, std::int64_t k) -> std::uint32_t {
    if (!zp) return offset;
    const std::int64_t r = n / grid.bn, c = group_col(k) / grid.bk;
    if (zp_packed)  // packed along the rows: word (r / per, c) holds rows r..r+per-1 of column c
      return packed_at([&](std::int64_t w) { return word_at(*zp, w * zcols + c); }, r, bits);
    const auto z = static_cast<std::int64_t>(load_element(zp->type(), zp->data(), r * zcols + c));
    return static_cast<std::uint32_t>(z + offset);
  };
  auto scale = [&](std::int64_t n, std::int64_t k) { return grid.at(n, group_col(k)); };
  TRY_ASSIGN(w, affine_weight(N, K, bits, perm ? &*perm : nullptr, code, zero, scale, p + ".weight_scale", x.file));
  out.weight = std::move(w);
  if (perm) out.input_perm = perm_tensor(*perm);
  return out;
}

// FP8: an F8_E4M3 weight [N, K] with weight_scale_inv (fine-grained fp8: w = code x scale_inv) or
// weight_scale (compressed-tensors, fbgemm) of any grid.
result<hf_quant_linear, load_error> convert_fp8(const context& x, const std::string& p, const std::string& scale_name) {
  TRY_ASSIGN(w, x.need(p + ".weight"));
  TRY_ASSIGN(sc, x.need(scale_name));
  if (w.type() != dtype::fp8_e4m3 || w.shape().rank() != 2)
    return unexpected(malformed(x.file, p + ".weight", "expected F8_E4M3 [N, K], got " + std::string(name(w.type())) + w.shape().str()));
  const std::int64_t N = w.shape()[0], K = w.shape()[1];
  if (K % 32 != 0) return unexpected(unsupported(x.file, p + ".weight", "K = " + std::to_string(K) + " (whole 32-blocks are read)"));
  TRY_ASSIGN(grid, grid_of(sc, scale_name, N, K, x.c.block, false, x.file));
  hf_quant_linear out;
  out.weight_name = p + ".weight";
  out.consumed = {p + ".weight", scale_name};
  tensor t(dtype::fp8_s32, troupe::shape{N, K});
  std::byte* dst = t.data();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t b = 0; b < K / 32; ++b, dst += 36) {
      const float s = grid.at(n, 32 * b);
      std::memcpy(dst, &s, 4);
      std::memcpy(dst + 4, w.data() + n * K + 32 * b, 32);
    }
  out.weight = std::move(t);
  return out;
}

}  // namespace

result<void, load_error> for_each_hf_quant(const hf_quant_config& c, const std::vector<std::string>& names, const tensor_lookup& find,
                                           const std::string& file, const hf_quant_sink& sink) {
  const context x{c, find, file};
  auto add = [&](result<hf_quant_linear, load_error> r) -> result<void, load_error> {
    if (!r) return unexpected(std::move(r.error()));
    return sink(std::move(*r));
  };
  for (const auto& n : names) {
    result<void, load_error> r;
    switch (c.method) {
      case hf_quant_method::gptq:
        if (n.ends_with(".qweight")) r = add(convert_gptq(x, strip(n, ".qweight")));
        break;
      case hf_quant_method::awq:
        if (n.ends_with(".qweight")) r = add(convert_awq(x, strip(n, ".qweight")));
        break;
      case hf_quant_method::fp8:
        if (n.ends_with(".weight_scale_inv")) r = add(convert_fp8(x, strip(n, ".weight_scale_inv"), n));
        else if (n.ends_with(".weight_scale") && !find(strip(n, "_scale") + "_scale_inv")) r = add(convert_fp8(x, strip(n, ".weight_scale"), n));
        break;
      case hf_quant_method::compressed_tensors:
        if (n.ends_with(".weight_packed")) {
          r = add(convert_ct_int(x, strip(n, ".weight_packed"), true));
        } else if (n.ends_with(".weight_scale") && !find(strip(n, "_scale") + "_packed")) {
          const std::string p = strip(n, ".weight_scale");
          if (c.float_codes) r = add(convert_fp8(x, p, n));
          else r = add(convert_ct_int(x, p, false));
        }
        break;
    }
    if (!r) return unexpected(std::move(r.error()));
  }
  return {};
}

result<std::vector<hf_quant_linear>, load_error> convert_hf_quant(const hf_quant_config& c, const std::vector<std::string>& names,
                                                                  const tensor_lookup& find, const std::string& file) {
  std::vector<hf_quant_linear> out;
  auto r = for_each_hf_quant(c, names, find, file, [&](hf_quant_linear&& l) -> result<void, load_error> {
    out.push_back(std::move(l));
    return {};
  });
  if (!r) return unexpected(std::move(r.error()));
  return out;
}

}  // namespace troupe::load

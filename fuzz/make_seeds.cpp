// Writes the seed corpora for the fuzz targets into OUT_DIR/<target>/: small valid files made with
// troupe's own writers (so the seeds follow the formats as troupe reads them) and a few hand-written
// headers and configs. scripts/fuzz runs it before fuzzing, so no seed is committed.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

#include "engine/load/gguf.hpp"
#include "engine/load/safetensors.hpp"
#include "transport/codec.hpp"

namespace {

using namespace troupe;
using namespace troupe::load;

bool write_file(const std::filesystem::path& p, const void* data, std::size_t n) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  return static_cast<bool>(out);
}
bool write_text(const std::filesystem::path& p, std::string_view s) { return write_file(p, s.data(), s.size()); }

std::vector<std::byte> bytes_of(std::size_t n) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 37 + 11) & 0xff);
  return out;
}

bool gguf_seeds(const std::filesystem::path& dir) {
  const auto f32 = bytes_of(4 * 8), q4 = bytes_of(18 * 2), q8k = bytes_of(292), i16 = bytes_of(6);
  bool ok = true;
  for (const std::uint32_t version : {2u, 3u}) {
    gguf_writer w({.version = version});
    w.add("general.architecture", "llama");
    w.add("llama.block_count", std::uint32_t{2});
    w.add("llama.context_length", std::uint64_t{4096});
    w.add("llama.rope.freq_base", 10000.0f);
    w.add("u8", std::uint8_t{1});
    w.add("i8", std::int8_t{-1});
    w.add("u16", std::uint16_t{2});
    w.add("i16", std::int16_t{-2});
    w.add("i32", std::int32_t{-3});
    w.add("i64", std::int64_t{-4});
    w.add("f64", 0.5);
    w.add("bool", true);
    w.add("tokenizer.ggml.tokens", gguf_array{gguf_type::string, {"<s>", "a", "b"}});
    w.add("tokenizer.ggml.scores", gguf_array{gguf_type::f32, {0.0f, -1.0f, -2.0f}});
    w.add("nested", gguf_array{gguf_type::array, {gguf_array{gguf_type::u8, {std::uint8_t{1}}}}});
    w.add_tensor("token_embd.weight", tensor_view(dtype::f32, {2, 4}, f32.data()));
    w.add_tensor("blk.0.attn_q.weight", tensor_view(dtype::q4_0, {2, 32}, q4.data()));
    w.add_tensor("blk.0.ffn.weight", tensor_view(dtype::q8_k, {1, 256}, q8k.data()));
    w.add_tensor("scale", tensor_view(dtype::i16, {3}, i16.data()));
    const auto b = w.serialize("seed");
    ok = ok && b && write_file(dir / ("v" + std::to_string(version) + ".gguf"), b->data(), b->size());
  }
  gguf_writer aligned({.alignment = 64});
  aligned.add("general.name", "aligned");
  aligned.add_tensor("x", tensor_view(dtype::i16, {3}, i16.data()));
  const auto b = aligned.serialize("seed");
  return ok && b && write_file(dir / "aligned.gguf", b->data(), b->size());
}

bool safetensors_seeds(const std::filesystem::path& dir) {
  const auto a = bytes_of(16), b = bytes_of(6), c = bytes_of(1);
  const std::vector<named_view> tensors = {{"a", tensor_view(dtype::f32, {2, 2}, a.data())},
                                           {"b", tensor_view(dtype::bf16, {3}, b.data())},
                                           {"c", tensor_view(dtype::u8, {}, c.data())}};
  return write_safetensors(dir / "file.safetensors", tensors, {{"format", "pt"}}).has_value() &&
         write_text(dir / "header.json",
                    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                    R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},)"
                    R"("c":{"dtype":"BOOL","shape":[],"data_offsets":[22,23]}})") &&
         write_text(dir / "empty.json", "{}");
}

bool config_seeds(const std::filesystem::path& dir) {
  return write_text(dir / "llama.json",
                    R"({"model_type":"llama","architectures":["LlamaForCausalLM"],"hidden_size":64,)"
                    R"("num_hidden_layers":2,"rms_norm_eps":1e-05,"tie_word_embeddings":false,)"
                    R"("eos_token_id":[1,2],"rope_scaling":{"factor":8.0,"rope_type":"llama3"},)"
                    R"("sliding_window":null,"torch_dtype":"bfloat16"})") &&
         write_text(dir / "dotted.json", R"({"a.b":1,"a":{"b":{"c":[1.5,2]},"d":"x"},"e":true})");
}

// A config length, a quantization config and a safetensors image of one small linear per method.
bool hf_quant_seeds(const std::filesystem::path& dir) {
  auto seed = [&](const char* file, std::string_view config, std::vector<named_view> tensors) {
    const auto tmp = dir / (std::string(file) + ".st");
    if (!write_safetensors(tmp, tensors)) return false;
    std::ifstream in(tmp, std::ios::binary);
    std::vector<char> st((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::filesystem::remove(tmp);
    std::vector<char> out(4 + config.size());
    const auto len = static_cast<std::uint32_t>(config.size());
    std::memcpy(out.data(), &len, 4);
    std::memcpy(out.data() + 4, config.data(), config.size());
    out.insert(out.end(), st.begin(), st.end());
    return write_file(dir / file, out.data(), out.size());
  };
  const auto qw = bytes_of(4 * 4 * 16), qz = bytes_of(4 * 2), sc = bytes_of(2 * 16 * 1), gi = bytes_of(4 * 32);
  const auto e4 = bytes_of(16 * 32), s4 = bytes_of(4);
  return seed("gptq", R"({"quantization_config":{"quant_method":"gptq","bits":4,"group_size":32,"desc_act":true,"sym":false}})",
              {{"m.qweight", tensor_view(dtype::i32, {4, 16}, qw.data())},
               {"m.qzeros", tensor_view(dtype::i32, {1, 2}, qz.data())},
               {"m.scales", tensor_view(dtype::f16, {1, 16}, sc.data())},
               {"m.g_idx", tensor_view(dtype::i32, {32}, gi.data())}}) &&
         seed("awq", R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":32,"version":"gemm","zero_point":true}})",
              {{"m.qweight", tensor_view(dtype::i32, {32, 2}, qw.data())},
               {"m.qzeros", tensor_view(dtype::i32, {1, 2}, qz.data())},
               {"m.scales", tensor_view(dtype::f16, {1, 16}, sc.data())}}) &&
         seed("fp8", R"({"quantization_config":{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[128,128]}})",
              {{"m.weight", tensor_view(dtype::fp8_e4m3, {16, 32}, e4.data())},
               {"m.weight_scale_inv", tensor_view(dtype::f32, {1, 1}, s4.data())}}) &&
         seed("ct", R"({"quantization_config":{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{"g":{"weights":{"num_bits":4,"type":"int","symmetric":false,"strategy":"group","group_size":32}}}}})",
              {{"m.weight_packed", tensor_view(dtype::i32, {16, 4}, qw.data())},
               {"m.weight_shape", tensor_view(dtype::i32, {2}, gi.data())},
               {"m.weight_scale", tensor_view(dtype::f16, {16, 1}, sc.data())},
               {"m.weight_zero_point", tensor_view(dtype::i32, {2, 1}, qz.data())}});
}

// One envelope of each message kind the transport knows.
bool transport_seeds(const std::filesystem::path& dir) {
  using namespace troupe::transport;
  job_submit j;
  j.job_id = 1;
  j.model = "m";
  j.prompt = std::vector<std::int32_t>{1, 2, 3};
  j.sampling.logit_bias = {{5, 1.0f}};
  j.stop = {"x"};
  j.inputs = {{"e", troupe::dtype::f32, {1, 2}, std::string(8, '\0'), {0}}};
  const message all[] = {j,
                         token_chunk{1, {5}, "a", {{5, -1.0f, {{5, -1.0f}}}}, finish_reason::eos, {1, 1, 0}},
                         cancel_job{1},
                         error{1, error_code::overloaded, "busy", retry::overloaded},
                         step_batch{entry_key{}, {1}, {0}, {0}, {0, -1}, {{1, 0, {}, false}}},
                         entry_key{program_kind::step, 4, 1, 64, kv_layout::paged, 16, 32, logit_rows::last, false, {}},
                         load_request{"m", "cpu:0", "", 1, 2, 3, 4},
                         node_hello{"n", "h", 1, {{"cpu:0", device_kind::cpu, 1}}},
                         inventory{{{"n", {{"cpu:0", device_kind::cpu, 1}}}}},
                         deploy{"m", 1, {}},
                         scale{"m", 2},
                         stats{1, 2, 3, 4, 5.0, 6, 7}};
  int i = 0;
  for (const auto& m : all) {
    const auto b = encode(m);
    if (!write_file(dir / (std::string(kind(m)) + std::to_string(i++)), b.data(), b.size())) return false;
  }
  return true;
}

// LoRA adapters: a PEFT config (first byte 0) and a GGUF LoRA image (first byte 1).
bool lora_seeds(const std::filesystem::path& dir) {
  const std::string cfg = std::string(1, '\0') + R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "bias": "none"})";
  if (!write_file(dir / "peft_config", reinterpret_cast<const std::byte*>(cfg.data()), cfg.size())) return false;
  troupe::tensor a(troupe::dtype::f32, {2, 8}), b(troupe::dtype::f32, {4, 2});
  troupe::load::gguf_writer g;
  g.add("general.architecture", std::string("llama"));
  g.add("general.type", std::string("adapter"));
  g.add("adapter.type", std::string("lora"));
  g.add("adapter.lora.alpha", 4.0f);
  g.add_tensor("blk.0.attn_q.weight.lora_a", a.view());
  g.add_tensor("blk.0.attn_q.weight.lora_b", b.view());
  auto image = g.serialize("seed.gguf");
  if (!image) return false;
  std::vector<std::byte> bytes{std::byte{1}};
  bytes.insert(bytes.end(), image->begin(), image->end());
  return write_file(dir / "gguf_lora", bytes.data(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out = argv[1];
  const std::filesystem::path st = out / "safetensors_header_fuzz", gg = out / "gguf_fuzz",
                              cj = out / "config_json_fuzz", tr = out / "transport_decode_fuzz", hq = out / "hf_quant_fuzz",
                              lo = out / "lora_adapter_fuzz";
  std::error_code ec;
  for (const auto& d : {st, gg, cj, tr, hq, lo}) std::filesystem::create_directories(d, ec);
  if (ec || !safetensors_seeds(st) || !gguf_seeds(gg) || !config_seeds(cj) || !transport_seeds(tr) || !hf_quant_seeds(hq) ||
      !lora_seeds(lo)) {
    std::fprintf(stderr, "%s: cannot write the seeds under %s\n", argv[0], out.c_str());
    return 1;
  }
  return 0;
}

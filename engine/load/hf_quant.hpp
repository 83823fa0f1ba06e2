#pragma once
// Quantized Hugging Face checkpoints as people download them: GPTQ (AutoGPTQ / GPTQModel), AWQ
// (AutoAWQ's GEMM packing), FP8 (transformers' fine-grained "fp8", fbgemm_fp8) and compressed-tensors
// (pack-quantized, int-/naive-quantized, float-quantized). The config (config.json's
// quantization_config, or AutoGPTQ's quantize_config.json) is read and checked first: a form troupe
// cannot honour is refused naming the field before any weight is read. Each quantized linear's stored
// tensors (qweight / qzeros / scales / g_idx, weight_packed / weight_scale / weight_zero_point, or an
// F8_E4M3 weight with its scales) then become one [N, K] weight in troupe's row form, copying the codes
// and scales as stored, never decoding them:
//   * integer codes of 2 to 4 bits -> q4_a32 (f16 scale, integer zero per 32), 8 bits -> q8_a32 (f32
//     scale); the scale must be exact in f16 for q4_a32 (GPTQ and AWQ store f16 scales), else refused;
//   * E4M3 codes -> fp8_s32 (f32 scale per 32: per tensor, per channel, per group or per block).
// Act-order GPTQ (desc_act: column k in group g_idx[k]) is stored with its columns sorted by group, so
// each group is whole 32-blocks, and an i32 [K] permutation "<prefix>.input_perm" that the linear's
// input goes through first (x'[j] = x[perm[j]]).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/load/load_error.hpp"

namespace troupe::load {

enum class hf_quant_method : std::uint8_t { gptq, awq, fp8, compressed_tensors };
std::string_view name(hf_quant_method m);

struct hf_quant_config {
  hf_quant_method method = hf_quant_method::gptq;
  int bits = 4;                 // code width: 2, 3, 4 or 8 (8 for FP8)
  bool float_codes = false;     // FP8 E4M3 codes (fp8, fbgemm_fp8, compressed-tensors float)
  std::int64_t group_size = 0;  // GPTQ / AWQ: elements of K per scale, -1 one per row; 0 read from the scales
  bool act_order = false;       // GPTQ desc_act, compressed-tensors actorder "group"
  bool symmetric = true;
  bool zero_minus_one = false;  // GPTQ's v1 checkpoint format stores each zero point less one
  std::vector<std::int64_t> block;  // FP8 weight_block_size [rows, cols], when given
  bool static_activations = false;  // activation_scheme static: input_scale is stored (and not used)
  std::string format;               // compressed-tensors: pack-quantized, int-quantized, float-quantized, ...
  // "gptq 4-bit, group 128, act-order"
  std::string summary() const;
};

// The quantization a checkpoint's config declares (nullopt: none). `config_json` is config.json's
// text, `quantize_config_json` AutoGPTQ's quantize_config.json ("" when absent); `file` names them in
// errors.
result<std::optional<hf_quant_config>, load_error> parse_hf_quant(std::string_view config_json,
                                                                  std::string_view quantize_config_json,
                                                                  const std::string& file);
// The same for a checkpoint directory.
result<std::optional<hf_quant_config>, load_error> read_hf_quant(const std::filesystem::path& dir);

using tensor_lookup = std::function<std::optional<tensor_view>(std::string_view)>;

struct hf_quant_linear {
  std::string weight_name;           // "<prefix>.weight"
  tensor weight;                     // [N, K]: q4_a32, q8_a32 or fp8_s32
  std::optional<tensor> input_perm;  // i32 [K], named "<prefix>.input_perm"
  std::vector<std::string> consumed;  // the stored tensors it replaces
};

// Each quantized linear among `names` (the checkpoint's tensors) in troupe's row form, handed to `sink`
// as soon as it is made, so a caller can store it away before the next one exists. An error of the
// sink's stops the walk and is returned.
using hf_quant_sink = std::function<result<void, load_error>(hf_quant_linear&&)>;
result<void, load_error> for_each_hf_quant(const hf_quant_config& c, const std::vector<std::string>& names, const tensor_lookup& find,
                                           const std::string& file, const hf_quant_sink& sink);

// Every quantized linear among `names` (the checkpoint's tensors) in troupe's row form.
result<std::vector<hf_quant_linear>, load_error> convert_hf_quant(const hf_quant_config& c,
                                                                  const std::vector<std::string>& names,
                                                                  const tensor_lookup& find, const std::string& file);

}  // namespace troupe::load

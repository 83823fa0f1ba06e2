#pragma once
// The CUDA executor's internals, shared by cuda_executor.cpp (the executor: load, entries, steps,
// sampling) and its lowering, one file per op family (lowering/lower_elementwise.cpp, lower_reduce.cpp,
// lower_movement.cpp, lower_linear.cpp, lower_moe.cpp, lower_collective.cpp, lower_norm_rope.cpp,
// lower_attention.cpp, lower_recurrent.cpp). Private to engine/exec/cuda; built only where nvcc is found.
#include "engine/exec/cuda/cuda_executor.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "engine/compile/fusion.hpp"
#include "engine/core/half.hpp"
#include "engine/core/quant.hpp"
#include "engine/exec/cuda/kernels.hpp"
#include "engine/exec/lowering.hpp"
#include "engine/exec/cuda/linear_kernels.hpp"
#include "engine/exec/cuda/sample_kernels.hpp"

namespace troupe::exec::cuda {

namespace detail {


using graph::op;

inline std::string cuda_why(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

inline std::string lt_why(cublasStatus_t s) { return "cuBLAS status " + std::to_string(static_cast<int>(s)); }

inline exec_error device_fault(std::string where, std::string why) { return exec_error{exec_error_code::device_error, std::move(where), std::move(why)}; }

// Bump allocation over cudaMalloc'd chunks; everything lives until the executor goes.
class device_arena {
 public:
  device_arena() = default;
  device_arena(const device_arena&) = delete;
  device_arena& operator=(const device_arena&) = delete;
  ~device_arena() {
    for (auto* p : chunks_) cudaFree(p);
  }
  result<std::byte*, std::string> take(std::size_t bytes) {
    bytes = (std::max<std::size_t>(bytes, 1) + 255) & ~std::size_t{255};
    if (bytes > left_) {
      const std::size_t size = std::max(bytes, chunk_bytes);
      void* p = nullptr;
      if (auto e = cudaMalloc(&p, size); e != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky
        return unexpected("cudaMalloc of " + std::to_string(size) + " bytes: " + cuda_why(e) + " (" +
                          std::to_string(reserved_) + " bytes reserved before)");
      }
      chunks_.push_back(static_cast<std::byte*>(p));
      next_ = static_cast<std::byte*>(p);
      left_ = size;
      reserved_ += size;
    }
    std::byte* p = next_;
    next_ += bytes;
    left_ -= bytes;
    return p;
  }
  std::size_t reserved() const { return reserved_; }

 private:
  static constexpr std::size_t chunk_bytes = std::size_t{64} << 20;
  std::vector<std::byte*> chunks_;
  std::byte* next_ = nullptr;
  std::size_t left_ = 0, reserved_ = 0;
};

// Page-locked host memory for a step's copies.
struct pinned {
  std::byte* p = nullptr;
  std::size_t bytes = 0;
  pinned() = default;
  pinned(const pinned&) = delete;
  pinned& operator=(const pinned&) = delete;
  ~pinned() {
    if (p) cudaFreeHost(p);
  }
  bool reserve(std::size_t n) {
    if (n <= bytes) return true;
    if (p) cudaFreeHost(p);
    p = nullptr;
    bytes = 0;
    void* q = nullptr;
    if (cudaMallocHost(&q, std::max<std::size_t>(n, 64)) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    p = static_cast<std::byte*>(q);
    bytes = std::max<std::size_t>(n, 64);
    return true;
  }
};

struct dev_tensor {
  std::byte* ptr = nullptr;
  dtype type = dtype::f32;
  troupe::shape dims;
  std::size_t bytes = 0;
};

struct executable {
  const weight_source* weights = nullptr;
  std::map<std::string, dev_tensor> states;
  std::map<std::string, dev_tensor> uploaded;  // weights by role, stored format (or decoded to f16)
};

// One cuBLASLt product y[M, N] = x[M, K] W[N, K]^T (+ r), prepared at lowering.
struct lt_product {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  lt_product() = default;
  lt_product(const lt_product&) = delete;
  lt_product& operator=(const lt_product&) = delete;
  ~lt_product() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// A lowered equation: enqueues launches (device) or runs host work between them (collectives).
struct instr {
  std::function<std::optional<exec_error>()> run;
  bool host = false;
};

struct entry {
  executable_id exe;
  graph::graph g;
  compile::target_plan tp;  // the pruned graph, its buffer plan and the fusion candidates
  std::byte* arena = nullptr;
  std::size_t arena_bytes = 0;
  std::size_t own_bytes = 0;  // folded constants and literals uploaded for this entry
  std::vector<std::byte*> ptr;  // per value, device
  std::vector<instr> program;
  bool host_work = false;
  std::vector<std::unique_ptr<lt_product>> products;
  pinned staging;  // slots in, outputs out
  cudaGraphExec_t graph = nullptr;
  std::uint64_t graph_epoch = 0;
  int steps = 0;
  ~entry() {
    if (graph) cudaGraphExecDestroy(graph);
  }
};



inline ew to_ew(op o) {
  switch (o) {
    case op::neg: return ew::neg;
    case op::abs: return ew::abs;
    case op::exp: return ew::exp;
    case op::log: return ew::log;
    case op::sqrt: return ew::sqrt;
    case op::rsqrt: return ew::rsqrt;
    case op::recip: return ew::recip;
    case op::tanh: return ew::tanh;
    case op::erf: return ew::erf;
    case op::sigmoid: return ew::sigmoid;
    case op::silu: return ew::silu;
    case op::gelu_tanh: return ew::gelu_tanh;
    case op::add: return ew::add;
    case op::sub: return ew::sub;
    case op::mul: return ew::mul;
    case op::div: return ew::div;
    case op::maximum: return ew::maximum;
    case op::minimum: return ew::minimum;
    case op::pow: return ew::pow;
    case op::equal: return ew::equal;
    case op::less: return ew::less;
    case op::less_equal: return ew::less_equal;
    case op::greater: return ew::greater;
    case op::where: return ew::where;
    default: return ew::cast;
  }
}


}  // namespace detail

using namespace detail;

// One equation being lowered (cuda_executor::lower_eqn dispatches it to its family).
struct lower_ctx {
  entry& en;
  std::size_t i;  // the equation's index
  const std::vector<std::int64_t>& residual_of;  // per equation: the add's side a linear's epilogue takes, or -1
  const std::vector<std::int64_t>& gated_of;     // per equation: the activation a gated product fuses, or -1
};

class cuda_executor final : public executor {
 public:
  explicit cuda_executor(const cuda_options& o) : opt_(o) {}
  ~cuda_executor() override;

  result<void, exec_error> init();

  std::string_view target() const override { return "cuda"; }
  result<executable_id, exec_error> load(const weight_source& weights) override;
  result<entry_id, exec_error> add_entry(executable_id exe, const graph::graph& g) override;
  result<step_outputs, exec_error> step(entry_id entry, const step_inputs& in) override;
  result<void, exec_error> reset_states(executable_id exe) override;
  result<tensor, exec_error> read_state(executable_id exe, const std::string& name) const override;
  result<void, exec_error> copy_state_rows(executable_id exe, std::span<const std::pair<std::int64_t, std::int64_t>> rows,
                                           std::span<const std::string> only = {}) override;
  result<void, exec_error> reload_expert(executable_id exe, const graph::weight_role& role, std::int64_t index) override;
  memory_report memory() const override;
  result<std::vector<sampled_row>, exec_error> step_sample(entry_id entry, const step_inputs& in,
                                                           std::span<const sample_row_request> rows,
                                                           const mask_hook& masks, step_outputs* rest) override;
  result<void, exec_error> open_history(std::uint64_t sequence, std::int64_t vocab, std::span<const std::int32_t> prompt,
                                        std::span<const std::pair<std::int32_t, float>> bias) override;
  void close_history(std::uint64_t sequence) override;
  void record_history(std::uint64_t sequence, std::span<const std::int32_t> tokens) override;

 private:
  // Every CUDA call goes through here: a fault at prepare is an error of that call; during a step it
  // poisons the executor.
  std::optional<exec_error> check(cudaError_t e, const std::string& where, bool in_step) {
    if (e == cudaSuccess) return std::nullopt;
    auto err = device_fault(where, cuda_why(e));
    if (in_step) poison(err);
    return err;
  }
  void poison(const exec_error& e) {
    if (!poisoned_) poisoned_ = e.where + ": " + e.reason;
  }
  // Every entry point first binds this thread to the executor's device (the driver steps from its own
  // thread, not the one that made the executor), and refuses once poisoned.
  std::optional<exec_error> refused_if_poisoned() const {
    if (poisoned_) return device_fault("cuda", "the executor is poisoned by an earlier device fault: " + *poisoned_);
    if (auto e = cudaSetDevice(opt_.device); e != cudaSuccess) return device_fault("cudaSetDevice", cuda_why(e));
    return std::nullopt;
  }
  result<dev_tensor, exec_error> upload(const tensor_view& t, const std::string& where);
  result<const dev_tensor*, exec_error> weight(executable& ex, const graph::weight_role& role, bool as_linear);
  result<void, exec_error> lower(entry& en);
  std::optional<exec_error> lower_eqn(entry& en, std::size_t i, const std::vector<std::int64_t>& residual_of,
                                      const std::vector<std::int64_t>& gated_of);
  // One per op family (lowering/lower_*.cpp): the equation lowered, or why not.
  std::optional<exec_error> lower_elementwise(lower_ctx& c);  // neg, abs, exp, log, sqrt, rsqrt, recip, tanh, erf, sigmoid, silu, gelu_tanh, add, sub, mul, div, maximum, minimum, pow, equal, less, less_equal, greater, where, cast
  std::optional<exec_error> lower_reduce(lower_ctx& c);  // reduce_sum, reduce_max, reduce_mean, arg_max, softmax, log_softmax
  std::optional<exec_error> lower_movement(lower_ctx& c);  // reshape, transpose, slice, concat, broadcast
  std::optional<exec_error> lower_linear(lower_ctx& c);  // matmul, linear, gather_rows
  std::optional<exec_error> lower_moe(lower_ctx& c);  // top_k, take_along, linear_id
  std::optional<exec_error> lower_collective(lower_ctx& c);  // all_reduce, all_gather, pipe_send, pipe_recv
  std::optional<exec_error> lower_norm_rope(lower_ctx& c);  // rms_norm, layer_norm, rope
  std::optional<exec_error> lower_attention(lower_ctx& c);  // scatter_rows, attention
  std::optional<exec_error> lower_recurrent(lower_ctx& c);  // ssm_conv, ssm_scan, delta_rule
  result<dtype, exec_error> weight_type(const entry& en, graph::value_id wv, const std::string& where) const;
  std::optional<exec_error> lower_linear(entry& en, const graph::equation& le, float* y, const float* r,
                                         const std::string& where);
  // Runs an entry: slots in, launches (or its graph), states; outputs stay on the device.
  std::optional<exec_error> run(entry& en, const step_inputs& in);
  std::optional<exec_error> finish_step(entry& en, const std::vector<std::string>* names, step_outputs& out);
  std::optional<exec_error> flag_error(entry& en);
  result<int, exec_error> history_slot(std::uint64_t sequence, std::int64_t vocab, const std::set<int>& busy);
  std::optional<exec_error> ensure_sampler(int rows, std::int64_t vocab);

  cuda_options opt_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  device_arena arena_;
  std::byte* workspace_ = nullptr;  // cuBLASLt's
  static constexpr std::size_t workspace_bytes = std::size_t{32} << 20;
  step_flag* flag_ = nullptr;       // device
  pinned flag_host_;
  // Block-format weights decoded to f16 for a cuBLASLt product (prefill); grown at prepare only (a
  // new buffer invalidates captured graphs through the epoch).
  std::byte* decode_buf_ = nullptr;
  std::size_t decode_bytes_ = 0;
  // The activations of a cuBLASLt product rounded to the weight's half type: one buffer for every
  // entry (steps run one at a time), grown at prepare like decode_buf_.
  std::byte* half_buf_ = nullptr;
  std::size_t half_bytes_ = 0;
  std::uint64_t epoch_ = 0;
  std::vector<std::unique_ptr<executable>> exes_;
  std::vector<std::unique_ptr<entry>> entries_;
  std::size_t weight_bytes_ = 0, state_bytes_ = 0, scratch_bytes_ = 0;
  std::optional<std::string> poisoned_;
  mutable std::mutex structure_;

  // Device-kept sampling histories: a cache of the host histories (the base class keeps those), one
  // slot per sequence, refreshed when the host's copy changed other than by a device pick.
  struct slot_state {
    std::uint64_t sequence = 0;
    bool used = false;
    bool dirty = true;
    std::uint64_t last_use = 0;
  };
  std::int64_t hist_vocab_ = 0;
  std::int32_t* hist_counts_ = nullptr;
  std::uint8_t* hist_prompt_ = nullptr;
  float* hist_bias_ = nullptr;
  std::vector<slot_state> slots_;
  std::map<std::uint64_t, int> slot_of_;
  std::uint64_t use_clock_ = 0;
  pinned hist_stage_;
  device_sample_row* rows_dev_ = nullptr;
  device_sample_out* out_dev_ = nullptr;
  std::uint32_t* masks_dev_ = nullptr;
  std::byte* sample_work_ = nullptr;
  int sample_rows_cap_ = 0;
  pinned sample_stage_;
};

}  // namespace troupe::exec::cuda

// The equation's context as locals, so that the closures copy what they use: en, g, e, i, where,
// P(value) and T(value) (its device bytes and type), out, ot, n, st, flag, eqn, device(f) (appends a
// launch to the program), map_of, too_deep, residual_of, gated_of. Inside a cuda_executor member.
#define TROUPE_CUDA_LOWERING_LOCALS(c)                  \
  [[maybe_unused]] auto& en = (c).en;                   \
  [[maybe_unused]] const std::size_t i = (c).i;         \
  [[maybe_unused]] const auto& residual_of = (c).residual_of; \
  [[maybe_unused]] const auto& gated_of = (c).gated_of; \
  [[maybe_unused]] const auto& g = en.g; \
  [[maybe_unused]] const auto& e = g.equations()[i]; \
  [[maybe_unused]] const std::string where = "eqn " + std::to_string(i) + " (" + std::string(graph::op_name(e.code)) + ")"; \
  [[maybe_unused]] auto P = [&](graph::value_id v) { return en.ptr[v.index]; }; \
  [[maybe_unused]] auto T = [&](graph::value_id v) -> const graph::tensor_type& { return g.info(v).type; }; \
  [[maybe_unused]] std::byte* out = P(e.out); \
  [[maybe_unused]] const auto ot = T(e.out); \
  [[maybe_unused]] const std::int64_t n = ot.dims.numel(); \
  [[maybe_unused]] cudaStream_t st = stream_; \
  [[maybe_unused]] step_flag* flag = flag_; \
  [[maybe_unused]] const auto eqn = static_cast<std::int32_t>(i); \
  [[maybe_unused]] auto device = [&](std::function<void()> f) { \
    en.program.push_back({[f = std::move(f)]() -> std::optional<exec_error> { \
      f(); \
      return std::nullopt; \
    }}); \
    return std::optional<exec_error>{}; \
  }; \
  [[maybe_unused]] auto map_of = [&](const troupe::shape& out_dims, std::initializer_list<std::vector<std::int64_t>> strides) -> std::optional<nd_map> { \
    if (out_dims.rank() > static_cast<std::size_t>(max_rank)) return std::nullopt; \
    nd_map m; \
    m.rank = static_cast<std::int32_t>(out_dims.rank()); \
    for (std::size_t d = 0; d < out_dims.rank(); ++d) m.dims[d] = out_dims[d]; \
    int k = 0; \
    for (const auto& s : strides) { \
      for (std::size_t d = 0; d < s.size(); ++d) m.strides[k][d] = s[d]; \
      ++k; \
    } \
    return m; \
  }; \
  [[maybe_unused]] auto too_deep = [&] { return exec_error{exec_error_code::unsupported, where, "rank above " + std::to_string(max_rank)}; }

#pragma once
// The CUDA executor: the executor contract on an NVIDIA GPU. Plain C++ (no CUDA header): a build
// without nvcc links engine/exec/cuda/cuda_unavailable.cpp instead, whose factory refuses by name, so
// callers (the CLI, the node, the tests) never branch on the build.
//
// What it does: weights are uploaded once per executable in their stored formats (f32, f16, bf16,
// q8_0, q4_0, q4_k, q6_k byte for byte; other GGUF block formats decoded to f16 at load) into one
// device arena; each entry is compiled by the shared passes (folding, dead code, the residual and
// gated fusions, buffer planning by liveness) and lowered to kernel launches over its own slice of
// the arena, so a step allocates nothing. Linears run as a dequantizing GEMV for up to
// `gemv_max_rows` rows and through cuBLASLt above (f16/bf16/f32 weights directly, block formats
// decoded to f16 first), with the residual add as the GEMM's C. Attention is one flash-style kernel
// over the KV map (paged or contiguous alike, GQA). An entry without host work (collectives) is
// captured into a CUDA graph on its second step and replayed after. Head::Sample runs on the device
// over device-kept token histories (engine/exec/cuda/sample_kernels.hpp): the host reads back token
// ids, flags and logprobs only. Every CUDA and cuBLAS call is checked; a fault during a step poisons
// the executor (every later call is refused with device_error naming the first fault).
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/collective.hpp"
#include "engine/core/result.hpp"
#include "engine/exec/executor.hpp"

namespace troupe::exec::cuda {

struct cuda_options {
  int device = 0;
  // The tensor-parallel group and the pipeline this executor is one rank of (as cpu_options): their
  // ops stage through host memory (the collective's own transport moves the bytes).
  collective* group = nullptr;
  collective* pipe = nullptr;
  bool graphs = true;                // capture entries into CUDA graphs
  std::int64_t gemv_max_rows = 8;    // rows up to which a linear runs as the GEMV kernel
  int history_slots = 256;           // sequences whose sampling histories the device keeps at once
};

struct device_info {
  int index = 0;
  std::string name;
  std::size_t memory_bytes = 0;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
};

// The devices this build and machine can use, or why none (no CUDA in this build, no driver, no
// device): the message is what tests print when they skip.
result<std::vector<device_info>, std::string> devices();

result<std::unique_ptr<executor>, exec_error> make_executor(const cuda_options& options = {});

// Device-to-device copy bandwidth of `device` in GB/s (a `bytes` buffer copied `repeats` times, timed
// with events; read + write bytes counted), for the bandwidth bound of decode.
result<double, std::string> copy_bandwidth(int device, std::size_t bytes = std::size_t{1} << 30, int repeats = 20);

}  // namespace troupe::exec::cuda

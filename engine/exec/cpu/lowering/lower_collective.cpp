// Collectives: the tensor-parallel group's all_reduce and all_gather, the pipeline's send and receive.
#include "engine/exec/cpu/lowering/lower.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::exec::cpu::lowering {

instr lower_collective(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::all_reduce: {
      collective* group = opt.group;
      if (group == nullptr) {
        err = exec_error{exec_error_code::unsupported, where, "a tensor-parallel shard's graph needs the executor's group (cpu_options::group)"};
        return {};
      }
      const auto* x = P(e.inputs[0]);
      return [=]() -> std::optional<exec_error> {
        if (x != out) std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float));
        if (auto r = group->all_reduce_sum(std::span(reinterpret_cast<float*>(out), static_cast<std::size_t>(n))); !r)
          return fail(exec_error_code::device_error, where, r.error());
        return std::nullopt;
      };
    }
    case op::all_gather: {
      collective* group = opt.group;
      if (group == nullptr) {
        err = exec_error{exec_error_code::unsupported, where, "a tensor-parallel shard's graph needs the executor's group (cpu_options::group)"};
        return {};
      }
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto& xd = T(e.inputs[0]).dims;
      const std::int64_t C = xd.back(), M = C == 0 ? 0 : xd.numel() / C, R = e.attrs.ints[0];
      std::vector<float> all(static_cast<std::size_t>(R * M * C));
      return [=]() mutable -> std::optional<exec_error> {
        if (auto r = group->all_gather(std::span(x, static_cast<std::size_t>(M * C)), all); !r)
          return fail(exec_error_code::device_error, where, r.error());
        auto* y = reinterpret_cast<float*>(out);
        for (std::int64_t r = 0; r < R; ++r)
          for (std::int64_t m = 0; m < M; ++m) std::memcpy(y + m * R * C + r * C, all.data() + (r * M + m) * C, static_cast<std::size_t>(C) * sizeof(float));
        return std::nullopt;
      };
    }
    case op::pipe_send: {
      collective* pipe = opt.pipe;
      if (pipe == nullptr) {
        err = exec_error{exec_error_code::unsupported, where, "a pipeline stage's graph needs the executor's pipe (cpu_options::pipe)"};
        return {};
      }
      const auto* x = P(e.inputs[0]);
      const int to = static_cast<int>(e.attrs.ints[0]);
      return [=]() -> std::optional<exec_error> {
        if (x != out) std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float));
        if (auto r = pipe->send(std::span(reinterpret_cast<const float*>(out), static_cast<std::size_t>(n)), to); !r)
          return fail(exec_error_code::device_error, where, r.error());
        return std::nullopt;
      };
    }
    case op::pipe_recv: {
      collective* pipe = opt.pipe;
      if (pipe == nullptr) {
        err = exec_error{exec_error_code::unsupported, where, "a pipeline stage's graph needs the executor's pipe (cpu_options::pipe)"};
        return {};
      }
      const int from = static_cast<int>(e.attrs.ints[0]);
      return [=]() -> std::optional<exec_error> {
        if (auto r = pipe->recv(std::span(reinterpret_cast<float*>(out), static_cast<std::size_t>(n)), from); !r)
          return fail(exec_error_code::device_error, where, r.error());
        return std::nullopt;
      };
    }
    default: break;
  }
  err = exec_error{exec_error_code::unsupported, where, "no CPU lowering"};
  return nullptr;
}

}  // namespace troupe::exec::cpu::lowering

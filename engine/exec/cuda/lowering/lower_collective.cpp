// Collectives: the tensor-parallel group's all_reduce and all_gather, the pipeline's send and receive (host staged).
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_collective(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::all_reduce: case op::all_gather: case op::pipe_send: case op::pipe_recv: {
      collective* c = e.code == op::pipe_send || e.code == op::pipe_recv ? opt_.pipe : opt_.group;
      if (c == nullptr)
        return exec_error{exec_error_code::unsupported, where,
                          e.code == op::pipe_send || e.code == op::pipe_recv ? "a pipeline stage's graph needs the executor's pipe (cuda_options::pipe)"
                                                                              : "a tensor-parallel shard's graph needs the executor's group (cuda_options::group)"};
      // Host-staged: the collective's transport moves host buffers.
      const std::byte* x = e.inputs.empty() ? nullptr : P(e.inputs[0]);
      const std::int64_t in_n = e.inputs.empty() ? 0 : T(e.inputs[0]).dims.numel();
      const auto code = e.code;
      const std::int64_t peer = e.attrs.ints.empty() ? 0 : e.attrs.ints[0];
      const auto& xd = e.inputs.empty() ? ot.dims : T(e.inputs[0]).dims;
      const std::int64_t C = xd.rank() ? xd.back() : 1, M = C == 0 ? 0 : in_n / C;
      auto buf = std::make_shared<std::vector<float>>(static_cast<std::size_t>(std::max(n, in_n)));
      auto all = std::make_shared<std::vector<float>>(code == op::all_gather ? static_cast<std::size_t>(n) : 0);
      en.program.push_back({[=, this]() -> std::optional<exec_error> {
        if (x && in_n > 0) {
          if (auto err = check(cudaMemcpyAsync(buf->data(), x, static_cast<std::size_t>(in_n) * 4, cudaMemcpyDeviceToHost, st), where, true)) return err;
          if (auto err = check(cudaStreamSynchronize(st), where, true)) return err;
        }
        result<void, std::string> r;
        switch (code) {
          case op::all_reduce: r = c->all_reduce_sum(std::span(buf->data(), static_cast<std::size_t>(n))); break;
          case op::all_gather: {
            std::vector<float> tmp(all->size());
            r = c->all_gather(std::span<const float>(buf->data(), static_cast<std::size_t>(in_n)), tmp);
            const std::int64_t R = C * M != 0 ? n / (C * M) : 0;
            for (std::int64_t rk = 0; rk < R && r; ++rk)
              for (std::int64_t m = 0; m < M; ++m)
                std::memcpy(all->data() + m * R * C + rk * C, tmp.data() + (rk * M + m) * C, static_cast<std::size_t>(C) * 4);
            break;
          }
          case op::pipe_send: r = c->send(std::span<const float>(buf->data(), static_cast<std::size_t>(n)), static_cast<int>(peer)); break;
          default: r = c->recv(std::span(buf->data(), static_cast<std::size_t>(n)), static_cast<int>(peer)); break;
        }
        if (!r) return device_fault(where, r.error());
        const float* src = code == op::all_gather ? all->data() : buf->data();
        if (code == op::pipe_send && x == out) return std::nullopt;
        if (auto err = check(cudaMemcpyAsync(out, src, static_cast<std::size_t>(n) * 4, cudaMemcpyHostToDevice, st), where, true)) return err;
        return check(cudaStreamSynchronize(st), where, true);
      }, true});
      return std::nullopt;
    }
    default: break;
  }
  return exec_error{exec_error_code::unsupported, where, "no CUDA lowering"};
}

}  // namespace troupe::exec::cuda

// The NCCL backend of the collective interface: one rank per CUDA device; host buffers are copied to a
// device buffer, reduced or gathered by NCCL on a stream of this rank's, and copied back. Every wait is
// bounded: a collective that does not finish within the timeout aborts the communicator (NCCL's own
// way out of a hang) and comes back as a timeout error. Compiled only where CUDA and NCCL exist
// (nccl_unavailable.cpp otherwise).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "transport/collectives.hpp"

namespace troupe::transport {
namespace {

namespace fs = std::filesystem;

collective_error fail(collective_error_code c, std::string why) { return collective_error{c, std::move(why)}; }

std::string cuda_why(cudaError_t e) { return std::string(cudaGetErrorString(e)); }
std::string nccl_why(ncclResult_t r) { return std::string(ncclGetErrorString(r)); }

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(ncclComm_t comm, cudaStream_t stream, int rank, int size, int device, std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), device_(device), timeout_(timeout) {}
  ~nccl_communicator() override {
    cudaSetDevice(device_);
    if (buffer_) cudaFree(buffer_);
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  result<void, collective_error> all_reduce_sum(std::span<float> data) override {
    if (auto r = stage_in(data.data(), data.size(), data.size()); !r) return r;
    if (auto r = ncclAllReduce(buffer_, buffer_, data.size(), ncclFloat32, ncclSum, comm_, stream_); r != ncclSuccess)
      return unexpected(fail(collective_error_code::transport, "ncclAllReduce: " + nccl_why(r)));
    return finish(data.data(), data.size());
  }

  result<void, collective_error> all_gather(std::span<const float> mine, std::span<float> all) override {
    if (all.size() != mine.size() * static_cast<std::size_t>(size_))
      return unexpected(fail(collective_error_code::invalid_argument, "all must hold size() x mine"));
    if (auto r = stage_in(mine.data(), mine.size(), all.size()); !r) return r;
    float* out = buffer_ + mine.size();
    if (auto r = ncclAllGather(buffer_, out, mine.size(), ncclFloat32, comm_, stream_); r != ncclSuccess)
      return unexpected(fail(collective_error_code::transport, "ncclAllGather: " + nccl_why(r)));
    return finish(all.data(), all.size(), mine.size());
  }

  result<void, collective_error> broadcast(std::span<float> data, int root) override {
    if (root < 0 || root >= size_) return unexpected(fail(collective_error_code::invalid_argument, "root outside the group"));
    if (auto r = stage_in(data.data(), data.size(), data.size()); !r) return r;
    if (auto r = ncclBroadcast(buffer_, buffer_, data.size(), ncclFloat32, root, comm_, stream_); r != ncclSuccess)
      return unexpected(fail(collective_error_code::transport, "ncclBroadcast: " + nccl_why(r)));
    return finish(data.data(), data.size());
  }

  result<void, collective_error> send(std::span<const float> data, int to) override {
    if (to < 0 || to >= size_ || to == rank_) return unexpected(fail(collective_error_code::invalid_argument, "send: no peer rank"));
    if (auto r = stage_in(data.data(), data.size(), 0); !r) return r;
    if (auto r = ncclSend(buffer_, data.size(), ncclFloat32, to, comm_, stream_); r != ncclSuccess)
      return unexpected(fail(collective_error_code::transport, "ncclSend: " + nccl_why(r)));
    return finish(nullptr, 0);
  }

  result<void, collective_error> recv(std::span<float> data, int from) override {
    if (from < 0 || from >= size_ || from == rank_) return unexpected(fail(collective_error_code::invalid_argument, "recv: no peer rank"));
    if (auto r = stage_in(nullptr, 0, data.size()); !r) return r;
    if (auto r = ncclRecv(buffer_, data.size(), ncclFloat32, from, comm_, stream_); r != ncclSuccess)
      return unexpected(fail(collective_error_code::transport, "ncclRecv: " + nccl_why(r)));
    return finish(data.data(), data.size());
  }

 private:
  // Copies `n` floats to the device buffer, sized for them and `out_n` more (an all_gather's output).
  result<void, collective_error> stage_in(const float* src, std::size_t n, std::size_t out_n) {
    cudaSetDevice(device_);
    const std::size_t need = (n + out_n) * sizeof(float);
    if (need > capacity_) {
      if (buffer_) cudaFree(buffer_);
      buffer_ = nullptr;
      capacity_ = 0;
      if (auto e = cudaMalloc(reinterpret_cast<void**>(&buffer_), need); e != cudaSuccess)
        return unexpected(fail(collective_error_code::transport, "cudaMalloc: " + cuda_why(e)));
      capacity_ = need;
    }
    if (n == 0) return {};
    if (auto e = cudaMemcpyAsync(buffer_, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_); e != cudaSuccess)
      return unexpected(fail(collective_error_code::transport, "copy to the device: " + cuda_why(e)));
    return {};
  }

  // Copies `n` floats back from buffer_ + offset and waits for the stream, at most the timeout.
  result<void, collective_error> finish(float* dst, std::size_t n, std::size_t offset = 0) {
    if (n > 0)
      if (auto e = cudaMemcpyAsync(dst, buffer_ + offset, n * sizeof(float), cudaMemcpyDeviceToHost, stream_); e != cudaSuccess)
        return unexpected(fail(collective_error_code::transport, "copy from the device: " + cuda_why(e)));
    const auto until = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      const auto q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return {};
      if (q != cudaErrorNotReady) return unexpected(fail(collective_error_code::transport, "stream: " + cuda_why(q)));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return unexpected(fail(collective_error_code::transport, "NCCL: " + nccl_why(async)));
      }
      if (std::chrono::steady_clock::now() > until) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return unexpected(fail(collective_error_code::timeout, "the collective did not finish within the timeout"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  float* buffer_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace

int cuda_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

result<std::unique_ptr<communicator>, collective_error> connect_nccl(const nccl_options& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) return unexpected(fail(collective_error_code::invalid_argument, "rank outside the group"));
  if (o.device < 0 || o.device >= cuda_devices())
    return unexpected(fail(collective_error_code::invalid_argument, "CUDA device " + std::to_string(o.device) + " is not present"));
  if (!o.store && (o.rendezvous_dir.empty() || !fs::is_directory(o.rendezvous_dir)))
    return unexpected(fail(collective_error_code::invalid_argument, "the rendezvous directory does not exist"));
  const fs::path id_file = fs::path(o.rendezvous_dir) / (o.prefix + ".nccl-id");
  ncclUniqueId id{};
  const std::string id_key = o.prefix + ".nccl-id";
  if (o.store && o.rank == 0) {
    if (auto r = ncclGetUniqueId(&id); r != ncclSuccess)
      return unexpected(fail(collective_error_code::connect_failed, "ncclGetUniqueId: " + nccl_why(r)));
    if (auto r = o.store->set(id_key, std::string(id.internal, sizeof id.internal)); !r)
      return unexpected(fail(collective_error_code::connect_failed, "publishing the NCCL id: " + r.error()));
  } else if (o.store) {
    const auto until = std::chrono::steady_clock::now() + o.timeout;
    for (;;) {
      auto v = o.store->get(id_key);
      if (!v) return unexpected(fail(collective_error_code::connect_failed, "reading the NCCL id: " + v.error()));
      if (*v && (*v)->size() == sizeof id.internal) {
        std::memcpy(id.internal, (*v)->data(), sizeof id.internal);
        break;
      }
      if (std::chrono::steady_clock::now() > until) return unexpected(fail(collective_error_code::timeout, "rank 0's NCCL id was not published"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } else if (o.rank == 0) {
    if (auto r = ncclGetUniqueId(&id); r != ncclSuccess)
      return unexpected(fail(collective_error_code::connect_failed, "ncclGetUniqueId: " + nccl_why(r)));
    const fs::path tmp = id_file.string() + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(id.internal, sizeof id.internal);
      if (!f) return unexpected(fail(collective_error_code::connect_failed, "cannot write " + tmp.string()));
    }
    std::error_code ec;
    fs::rename(tmp, id_file, ec);  // whole or absent: a peer never reads half an id
    if (ec) return unexpected(fail(collective_error_code::connect_failed, "cannot publish " + id_file.string() + ": " + ec.message()));
  } else {
    const auto until = std::chrono::steady_clock::now() + o.timeout;
    for (;;) {
      std::ifstream f(id_file, std::ios::binary);
      if (f && f.read(id.internal, sizeof id.internal)) break;
      if (std::chrono::steady_clock::now() > until)
        return unexpected(fail(collective_error_code::timeout, "rank 0's NCCL id did not appear in " + id_file.string()));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (auto e = cudaSetDevice(o.device); e != cudaSuccess)
    return unexpected(fail(collective_error_code::connect_failed, "cudaSetDevice: " + cuda_why(e)));
  cudaStream_t stream = nullptr;
  if (auto e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
    return unexpected(fail(collective_error_code::connect_failed, "cudaStreamCreate: " + cuda_why(e)));
  // Non-blocking init, so joining is bounded by the timeout too.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  auto r = ncclCommInitRankConfig(&comm, o.size, id, o.rank, &config);
  const auto until = std::chrono::steady_clock::now() + o.timeout;
  while (r == ncclSuccess || r == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (std::chrono::steady_clock::now() > until) {
      ncclCommAbort(comm);
      cudaStreamDestroy(stream);
      return unexpected(fail(collective_error_code::timeout, "the NCCL group did not form within the timeout"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return unexpected(fail(collective_error_code::connect_failed, "ncclCommInitRankConfig: " + nccl_why(r)));
  }
  return std::unique_ptr<communicator>(new nccl_communicator(comm, stream, o.rank, o.size, o.device, o.timeout));
}

}  // namespace troupe::transport

#pragma once
// The collective a tensor-parallel graph's all_reduce ops call (op::all_reduce). Each rank of a group
// runs its shard's graph on its own executor; every rank must reach the same all_reduce calls in the
// same order with the same lengths; the stages of a pipeline pass activations by send and recv. Plain C++: the cross-process implementations (Gloo, NCCL) live in
// transport/ and adapt to this; `local_group` is the in-process one (simulated devices on threads).
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/result.hpp"

namespace troupe {

class collective {
 public:
  virtual ~collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the element-wise sum over the ranks. An error (a rank that never
  // arrived within the group's timeout, lengths that differ) breaks the group for every rank.
  virtual result<void, std::string> all_reduce_sum(std::span<float> data) = 0;
  // `all` receives size() blocks of mine.size() floats, block r from rank r (all.size() must be
  // size() * mine.size()).
  virtual result<void, std::string> all_gather(std::span<const float> mine, std::span<float> all) = 0;
  // Point to point, between the stages of a pipeline (op::pipe_send, op::pipe_recv): `send` hands
  // `data` to rank `to`, `recv` fills `data` with what rank `from` sent (the lengths must agree). The
  // messages of one pair arrive in the order sent.
  virtual result<void, std::string> send(std::span<const float> data, int to) = 0;
  virtual result<void, std::string> recv(std::span<float> data, int from) = 0;
};

// A collective joined later: an executor is made with it (cpu_options::pipe) before its cross-process
// group has met, and `join` hands it the group. Until then every call is refused (size() is 0).
class deferred_collective final : public collective {
 public:
  void join(std::unique_ptr<collective> c) { inner_ = std::move(c); }
  bool joined() const { return inner_ != nullptr; }
  int rank() const override { return inner_ ? inner_->rank() : 0; }
  int size() const override { return inner_ ? inner_->size() : 0; }
  result<void, std::string> all_reduce_sum(std::span<float> data) override {
    if (!inner_) return unexpected(std::string("all_reduce: the group has not met yet"));
    return inner_->all_reduce_sum(data);
  }
  result<void, std::string> all_gather(std::span<const float> mine, std::span<float> all) override {
    if (!inner_) return unexpected(std::string("all_gather: the group has not met yet"));
    return inner_->all_gather(mine, all);
  }
  result<void, std::string> send(std::span<const float> data, int to) override {
    if (!inner_) return unexpected(std::string("send: the group has not met yet"));
    return inner_->send(data, to);
  }
  result<void, std::string> recv(std::span<float> data, int from) override {
    if (!inner_) return unexpected(std::string("recv: the group has not met yet"));
    return inner_->recv(data, from);
  }

 private:
  std::unique_ptr<collective> inner_;
};

// `size` ranks in one process, one per thread. Sums are taken in rank order, so every rank gets the same
// bits and a run is reproducible. A rank waits at most `timeout` for the others.
std::vector<std::unique_ptr<collective>> local_group(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace troupe

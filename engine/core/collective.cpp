#include "engine/core/collective.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>

namespace troupe {
namespace {

struct group_state {
  explicit group_state(int n, std::chrono::milliseconds t) : size(n), timeout(t), buffers(static_cast<std::size_t>(n)) {}
  const int size;
  const std::chrono::milliseconds timeout;
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::span<float>> buffers;  // this round's, by rank
  int arrived = 0;
  std::uint64_t round = 0;
  std::string broken;  // why the group failed; every later call fails with it
  std::vector<float> sum;
};

class local_rank final : public collective {
 public:
  local_rank(std::shared_ptr<group_state> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }

  result<void, std::string> all_reduce_sum(std::span<float> data) override {
    auto& s = *s_;
    std::unique_lock lock(s.m);
    if (!s.broken.empty()) return unexpected(s.broken);
    s.buffers[static_cast<std::size_t>(rank_)] = data;
    const auto my_round = s.round;
    if (++s.arrived == s.size) {
      for (const auto& b : s.buffers)
        if (b.size() != data.size()) {
          s.broken = "all_reduce: the ranks passed different lengths";
          s.cv.notify_all();
          return unexpected(s.broken);
        }
      s.sum.assign(data.size(), 0.0f);
      for (const auto& b : s.buffers)  // rank order: the same bits on every rank, every run
        for (std::size_t i = 0; i < b.size(); ++i) s.sum[i] += b[i];
      for (auto& b : s.buffers) std::copy(s.sum.begin(), s.sum.end(), b.begin());
      s.arrived = 0;
      ++s.round;
      s.cv.notify_all();
      return {};
    }
    if (!s.cv.wait_for(lock, s.timeout, [&] { return s.round != my_round || !s.broken.empty(); })) {
      s.broken = "all_reduce: rank " + std::to_string(rank_) + " waited " + std::to_string(s.timeout.count()) +
                 " ms for the others";
      s.cv.notify_all();
    }
    if (s.round != my_round) return {};
    return unexpected(s.broken);
  }

 private:
  std::shared_ptr<group_state> s_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<collective>> local_group(int size, std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<collective>> out;
  if (size < 1) return out;
  auto s = std::make_shared<group_state>(size, timeout);
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<local_rank>(s, r));
  return out;
}

}  // namespace troupe

#include "engine/core/collective.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

namespace troupe {
namespace {

struct group_state {
  explicit group_state(int n, std::chrono::milliseconds t)
      : size(n), timeout(t), buffers(static_cast<std::size_t>(n)), inputs(static_cast<std::size_t>(n)) {}
  const int size;
  const std::chrono::milliseconds timeout;
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::span<float>> buffers;  // this round's, by rank (an all_gather's output)
  std::vector<std::span<const float>> inputs;  // an all_gather's inputs, by rank
  int arrived = 0;
  std::uint64_t round = 0;
  std::string broken;  // why the group failed; every later call fails with it
  std::vector<float> sum;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> mail;  // (from, to): sent, not yet received
};

class local_rank final : public collective {
 public:
  local_rank(std::shared_ptr<group_state> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }

  result<void, std::string> all_reduce_sum(std::span<float> data) override {
    return round(data, {}, [](group_state& s) -> std::string {
      const auto n = s.buffers[0].size();
      for (const auto& b : s.buffers)
        if (b.size() != n) return "all_reduce: the ranks passed different lengths";
      s.sum.assign(n, 0.0f);
      for (const auto& b : s.buffers)  // rank order: the same bits on every rank, every run
        for (std::size_t i = 0; i < n; ++i) s.sum[i] += b[i];
      for (auto& b : s.buffers) std::copy(s.sum.begin(), s.sum.end(), b.begin());
      return {};
    });
  }

  result<void, std::string> all_gather(std::span<const float> mine, std::span<float> all) override {
    if (all.size() != mine.size() * static_cast<std::size_t>(s_->size)) return unexpected(std::string("all_gather: all must hold size() x mine"));
    return round(all, mine, [](group_state& s) -> std::string {
      const auto n = s.inputs[0].size();
      for (std::size_t r = 0; r < s.inputs.size(); ++r)
        if (s.inputs[r].size() != n || s.buffers[r].size() != n * s.inputs.size()) return "all_gather: the ranks passed different lengths";
      for (auto& out : s.buffers)
        for (std::size_t r = 0; r < s.inputs.size(); ++r) std::copy(s.inputs[r].begin(), s.inputs[r].end(), out.begin() + static_cast<std::ptrdiff_t>(r * n));
      return {};
    });
  }

  result<void, std::string> send(std::span<const float> data, int to) override {
    auto& s = *s_;
    if (to < 0 || to >= s.size || to == rank_) return unexpected("send: no peer rank " + std::to_string(to));
    std::lock_guard lock(s.m);
    if (!s.broken.empty()) return unexpected(s.broken);
    s.mail[{rank_, to}].emplace_back(data.begin(), data.end());
    s.cv.notify_all();
    return {};
  }

  result<void, std::string> recv(std::span<float> data, int from) override {
    auto& s = *s_;
    if (from < 0 || from >= s.size || from == rank_) return unexpected("recv: no peer rank " + std::to_string(from));
    std::unique_lock lock(s.m);
    auto& box = s.mail[{from, rank_}];
    if (!s.cv.wait_for(lock, s.timeout, [&] { return !box.empty() || !s.broken.empty(); })) {
      s.broken = "recv: rank " + std::to_string(rank_) + " waited " + std::to_string(s.timeout.count()) + " ms for rank " + std::to_string(from);
      s.cv.notify_all();
    }
    if (box.empty()) return unexpected(s.broken);
    if (box.front().size() != data.size()) {
      s.broken = "recv: rank " + std::to_string(from) + " sent " + std::to_string(box.front().size()) + " floats, rank " +
                 std::to_string(rank_) + " expected " + std::to_string(data.size());
      s.cv.notify_all();
      return unexpected(s.broken);
    }
    std::copy(box.front().begin(), box.front().end(), data.begin());
    box.pop_front();
    return {};
  }

 private:
  // One collective round: every rank posts its buffers; the last to arrive runs `combine` over all of
  // them (under the lock) and releases the others.
  template <class Combine>
  result<void, std::string> round(std::span<float> out, std::span<const float> in, Combine combine) {
    auto& s = *s_;
    std::unique_lock lock(s.m);
    if (!s.broken.empty()) return unexpected(s.broken);
    s.buffers[static_cast<std::size_t>(rank_)] = out;
    s.inputs[static_cast<std::size_t>(rank_)] = in;
    const auto my_round = s.round;
    if (++s.arrived == s.size) {
      if (auto why = combine(s); !why.empty()) {
        s.broken = std::move(why);
        s.cv.notify_all();
        return unexpected(s.broken);
      }
      s.arrived = 0;
      ++s.round;
      s.cv.notify_all();
      return {};
    }
    if (!s.cv.wait_for(lock, s.timeout, [&] { return s.round != my_round || !s.broken.empty(); })) {
      s.broken = "collective: rank " + std::to_string(rank_) + " waited " + std::to_string(s.timeout.count()) + " ms for the others";
      s.cv.notify_all();
    }
    if (s.round != my_round) return {};
    return unexpected(s.broken);
  }

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

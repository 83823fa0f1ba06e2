#include "engine/driver/rank_fanout.hpp"

namespace troupe::driver {

rank_workers::rank_workers(std::vector<rank_state>& ranks) : ranks_(ranks), errors_(ranks.size()) {
  for (std::size_t r = 0; r < ranks.size(); ++r) threads_.emplace_back([this, r] { loop(r); });
}

rank_workers::~rank_workers() {
  {
    std::lock_guard lock(m_);
    stopping_ = true;
  }
  go_.notify_all();
  for (auto& t : threads_) t.join();
}

void rank_workers::start(const entry_key& k, const exec::step_inputs& in) {
  std::lock_guard lock(m_);
  key_ = k;  // a copy: the caller's key may be a temporary
  in_ = &in;
  pending_ = ranks_.size();
  for (auto& e : errors_) e.reset();
  ++round_;
  go_.notify_all();
}

std::optional<exec::exec_error> rank_workers::wait() {
  std::unique_lock lock(m_);
  done_.wait(lock, [&] { return pending_ == 0; });
  for (auto& e : errors_)
    if (e) return e;
  return std::nullopt;
}

void rank_workers::loop(std::size_t r) {
  std::uint64_t seen = 0;
  for (;;) {
    std::unique_lock lock(m_);
    go_.wait(lock, [&] { return stopping_ || round_ != seen; });
    if (stopping_) return;
    seen = round_;
    const entry_key& k = key_;  // unchanged until every rank is done
    const exec::step_inputs& in = *in_;
    lock.unlock();
    std::optional<exec::exec_error> err;
    if (auto& rk = ranks_[r]; rk.remote) {
      if (auto done = rk.remote->step(k, in); !done)
        err = exec::exec_error{exec::exec_error_code::device_error, "remote rank " + std::to_string(r + 1), done.error()};
    } else if (auto out = rk.ex->step(rk.entries.at(k), in); !out) {
      err = out.error();
    }
    lock.lock();
    if (err) errors_[r] = std::move(err);
    if (--pending_ == 0) done_.notify_all();
  }
}

}  // namespace troupe::driver

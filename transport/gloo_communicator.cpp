// The CPU communicator: Gloo's TCP transport, rendezvous through a FileStore scoped by a prefix.
// Gloo reports failures by throwing (gloo::Exception, gloo::EnforceNotMet, std::exception); every
// entry point here catches them and returns a collective_error instead.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "transport/collectives.hpp"

namespace troupe::transport {

std::string_view name(collective_error_code c) {
  switch (c) {
    case collective_error_code::invalid_argument: return "invalid_argument";
    case collective_error_code::timeout: return "timeout";
    case collective_error_code::connect_failed: return "connect_failed";
    case collective_error_code::transport: return "transport";
  }
  return "unknown";
}

std::string collective_error::message() const {
  std::string m(name(code));
  if (!reason.empty()) {
    m += ": ";
    m += reason;
  }
  return m;
}

namespace {

unexpected<collective_error> fail(collective_error_code code, std::string reason) {
  return unexpected(collective_error{code, std::move(reason)});
}

bool mentions_timeout(std::string_view what) {
  std::string lower(what);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return lower.find("timeout") != std::string::npos || lower.find("timed out") != std::string::npos;
}

// A rendezvous_store as Gloo's store: `get` and `wait` poll until every key is set or the timeout passes.
class polled_store final : public gloo::rendezvous::Store {
 public:
  polled_store(rendezvous_store& s, std::chrono::milliseconds timeout) : s_(s), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    if (auto r = s_.set(key, std::string(data.begin(), data.end())); !r) throw std::runtime_error("rendezvous set " + key + ": " + r.error());
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    auto v = s_.get(key);
    if (!v || !*v) throw std::runtime_error("rendezvous get " + key + ": " + (v ? std::string("gone") : v.error()));
    return std::vector<char>((*v)->begin(), (*v)->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (const auto& k : keys)
      for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
        auto v = s_.get(k);
        if (!v) throw std::runtime_error("rendezvous get " + k + ": " + v.error());
        if (*v) break;
        if (std::chrono::steady_clock::now() > until) throw std::runtime_error("timeout waiting for rendezvous key " + k);
        std::this_thread::sleep_for(pause);
      }
  }

 private:
  rendezvous_store& s_;
  std::chrono::milliseconds timeout_;
};

// Wraps a store so that every wait, including the untimed ones Gloo issues internally (get() and
// wait(keys) default to 30 s), is bounded by our timeout, and remembers whether a wait ran out.
class bounded_store final : public gloo::rendezvous::Store {
 public:
  bounded_store(gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout)
      : inner_(inner), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    try {
      inner_.wait(keys, std::min(timeout, timeout_));
    } catch (...) {
      timed_out_ = true;  // the only way FileStore::wait throws besides a filesystem error
      throw;
    }
  }
  bool timed_out() const { return timed_out_; }

 private:
  gloo::rendezvous::Store& inner_;
  std::chrono::milliseconds timeout_;
  bool timed_out_ = false;
};

// Runs a Gloo call and turns whatever it throws into a typed error.
template <class F>
result<void, collective_error> guarded(const char* what, F&& f) {
  try {
    f();
    return {};
  } catch (const gloo::IoException& e) {
    return fail(mentions_timeout(e.what()) ? collective_error_code::timeout : collective_error_code::transport,
                std::string(what) + ": " + e.what());
  } catch (const std::exception& e) {  // gloo::Exception, gloo::EnforceNotMet, std::bad_alloc, ...
    return fail(mentions_timeout(e.what()) ? collective_error_code::timeout : collective_error_code::transport,
                std::string(what) + ": " + e.what());
  } catch (...) {
    return fail(collective_error_code::transport, std::string(what) + ": unknown exception");
  }
}

class gloo_communicator final : public communicator {
 public:
  gloo_communicator(std::shared_ptr<gloo::transport::Device> device,
                    std::shared_ptr<gloo::rendezvous::Context> context, std::chrono::milliseconds timeout)
      : device_(std::move(device)), context_(std::move(context)), timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  result<void, collective_error> all_reduce_sum(std::span<float> data) override {
    if (data.empty() || size() == 1) return {};
    return guarded("all_reduce_sum", [&] {
      // The tagged, unbound-buffer algorithm like the others: Gloo's older AllreduceRing registers
      // per-slot buffers that a fast peer's next collective can reach before they exist (a two-rank
      // run failed its fourth all-reduce in CI), and it ignores the timeout.
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());  // in place: the output is the input
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  result<void, collective_error> all_gather(std::span<const float> mine, std::span<float> all) override {
    if (all.size() != mine.size() * static_cast<std::size_t>(size()))
      return fail(collective_error_code::invalid_argument,
                  "all_gather: output holds " + std::to_string(all.size()) + " floats, expected " +
                      std::to_string(mine.size() * static_cast<std::size_t>(size())));
    if (mine.empty()) return {};
    if (size() == 1) {
      std::copy(mine.begin(), mine.end(), all.begin());
      return {};
    }
    return guarded("all_gather", [&] {
      gloo::AllgatherOptions opts(context_);
      // Gloo's input pointer is non-const but only read from.
      opts.setInput(const_cast<float*>(mine.data()), mine.size());
      opts.setOutput(all.data(), all.size());
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  result<void, collective_error> broadcast(std::span<float> data, int root) override {
    if (root < 0 || root >= size())
      return fail(collective_error_code::invalid_argument,
                  "broadcast: root " + std::to_string(root) + " outside [0, " + std::to_string(size()) + ")");
    if (data.empty() || size() == 1) return {};
    return guarded("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data.data(), data.size());  // in place: the root sends from its output
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  result<void, collective_error> send(std::span<const float> data, int to) override {
    if (to < 0 || to >= size() || to == rank())
      return fail(collective_error_code::invalid_argument, "send: no peer rank " + std::to_string(to));
    return guarded("send", [&] {
      // Gloo's buffer is non-const but a send only reads it.
      auto buf = context_->createUnboundBuffer(const_cast<float*>(data.data()), data.size() * sizeof(float));
      buf->send(to, pair_slot(sent_, to));
      if (!buf->waitSend(timeout_)) throw std::runtime_error("send aborted");
    });
  }

  result<void, collective_error> recv(std::span<float> data, int from) override {
    if (from < 0 || from >= size() || from == rank())
      return fail(collective_error_code::invalid_argument, "recv: no peer rank " + std::to_string(from));
    return guarded("recv", [&] {
      auto buf = context_->createUnboundBuffer(data.data(), data.size() * sizeof(float));
      buf->recv(from, pair_slot(received_, from));
      if (!buf->waitRecv(timeout_)) throw std::runtime_error("recv aborted");
    });
  }

 private:
  std::uint32_t next_tag() { return tag_++; }
  // The slot of a pair's next message: both ends count the messages between them, so they agree, and
  // the high bit keeps these slots apart from the collectives' tags.
  static std::uint64_t pair_slot(std::vector<std::uint64_t>& counts, int peer) {
    if (counts.size() <= static_cast<std::size_t>(peer)) counts.resize(static_cast<std::size_t>(peer) + 1, 0);
    return (std::uint64_t{1} << 40) + counts[static_cast<std::size_t>(peer)]++;
  }
  std::vector<std::uint64_t> sent_, received_;

  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::chrono::milliseconds timeout_;
  std::uint32_t tag_ = 1;
};

}  // namespace

result<std::unique_ptr<communicator>, collective_error> connect_gloo(const gloo_options& o) {
  if (o.size < 1) return fail(collective_error_code::invalid_argument, "size " + std::to_string(o.size) + " < 1");
  if (o.rank < 0 || o.rank >= o.size)
    return fail(collective_error_code::invalid_argument,
                "rank " + std::to_string(o.rank) + " outside [0, " + std::to_string(o.size) + ")");
  if (o.timeout <= std::chrono::milliseconds::zero())
    return fail(collective_error_code::invalid_argument, "timeout must be positive");
  if (!o.store) {
    std::error_code ec;
    if (o.rendezvous_dir.empty() || !std::filesystem::is_directory(o.rendezvous_dir, ec))
      return fail(collective_error_code::invalid_argument,
                  "rendezvous directory '" + o.rendezvous_dir + "' does not exist");
  }

  // Gloo's TCP pairs write with writev(2): a peer that left would raise SIGPIPE and kill this process
  // instead of making the collective an error. Ignore it, unless the program installed its own handler.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      sigaction(SIGPIPE, &ign, nullptr);
    }
  });

  std::shared_ptr<gloo::transport::Device> device;
  if (auto r = guarded("create TCP device", [&] {
        gloo::transport::tcp::attr attr;
        attr.hostname = o.host;
        device = gloo::transport::tcp::CreateDevice(attr);
      });
      !r) {
    r.error().code = collective_error_code::connect_failed;
    return unexpected(std::move(r.error()));
  }

  auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
  context->setTimeout(o.timeout);
  bool store_timed_out = false;
  auto r = guarded("rendezvous", [&] {
    std::unique_ptr<gloo::rendezvous::Store> base;
    if (o.store) base = std::make_unique<polled_store>(*o.store, o.timeout);
    else base = std::make_unique<gloo::rendezvous::FileStore>(o.rendezvous_dir);
    gloo::rendezvous::PrefixStore prefixed(o.prefix, *base);
    bounded_store store(prefixed, o.timeout);
    try {
      context->connectFullMesh(store, device);
    } catch (...) {
      store_timed_out = store.timed_out();
      throw;
    }
  });
  if (!r) {
    auto e = std::move(r.error());
    e.code = (store_timed_out || e.code == collective_error_code::timeout) ? collective_error_code::timeout
                                                                         : collective_error_code::connect_failed;
    return unexpected(std::move(e));
  }
  return std::unique_ptr<communicator>(new gloo_communicator(std::move(device), std::move(context), o.timeout));
}

namespace {

class communicator_collective final : public troupe::collective {
 public:
  explicit communicator_collective(std::unique_ptr<communicator> c) : c_(std::move(c)) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  result<void, std::string> all_reduce_sum(std::span<float> data) override {
    if (auto r = c_->all_reduce_sum(data); !r) return unexpected(r.error().message());
    return {};
  }
  result<void, std::string> all_gather(std::span<const float> mine, std::span<float> all) override {
    if (auto r = c_->all_gather(mine, all); !r) return unexpected(r.error().message());
    return {};
  }
  result<void, std::string> send(std::span<const float> data, int to) override {
    if (auto r = c_->send(data, to); !r) return unexpected(r.error().message());
    return {};
  }
  result<void, std::string> recv(std::span<float> data, int from) override {
    if (auto r = c_->recv(data, from); !r) return unexpected(r.error().message());
    return {};
  }

 private:
  std::unique_ptr<communicator> c_;
};

}  // namespace

std::unique_ptr<troupe::collective> as_collective(std::unique_ptr<communicator> c) {
  return std::make_unique<communicator_collective>(std::move(c));
}

}  // namespace troupe::transport

// The Gloo communicator across real processes on loopback: all_reduce_sum, all_gather and broadcast
// give the exact expected values for groups of 2 and 4 and buffers of 1, 7 and 100000 floats; a peer
// that never joins is a timeout error within a bounded time, not a hang; a peer that leaves makes the
// next collective an error; bad arguments are typed refusals.
//
// Each rank is a forked child that does all its Gloo work after the fork and reports through its exit
// status (0: success). The parent process never touches Gloo (Gloo's TCP device starts threads, and a
// process with threads must not fork), it only makes the rendezvous directory, forks, and waits with
// a deadline (killing children that overrun it, so a hang fails the test instead of stalling it).
#include "transport/collectives.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "apps/exec_runner.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"
#include "tests/support/logprobs.hpp"
#include "tests/support/tp_fixture.hpp"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;

struct child_status {
  bool exited = false;   // exited normally (not killed by a signal or by the deadline)
  int code = -1;         // exit code when exited
  int signal = 0;        // terminating signal otherwise
  bool overran = false;  // killed by the parent at the deadline
};

class collectives : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-gloo-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  gloo_options options(int rank, int size, const std::string& prefix, std::chrono::milliseconds timeout = 20s) {
    gloo_options o;
    o.rank = rank;
    o.size = size;
    o.rendezvous_dir = dir_;
    o.prefix = prefix;
    o.host = "127.0.0.1";
    o.timeout = timeout;
    return o;
  }

  // Forks one child per rank in `ranks`, each running body(rank) and exiting with its result; waits
  // for all of them, killing any still running at the deadline.
  std::vector<child_status> run_ranks(const std::vector<int>& ranks, const std::function<int(int)>& body,
                                      std::chrono::seconds deadline = 60s) {
    std::fflush(nullptr);  // don't let children flush the parent's buffered output again
    std::vector<pid_t> pids;
    for (int r : ranks) {
      pid_t pid = fork();
      if (pid == 0) {
        int code = 100;
        try {
          code = body(r);
        } catch (...) {
          code = 101;  // an exception escaped the communicator: the boundary leaked
        }
        std::fflush(nullptr);
        _exit(code);
      }
      EXPECT_GT(pid, 0) << "fork failed";
      pids.push_back(pid);
    }
    std::vector<child_status> out(pids.size());
    std::vector<bool> done(pids.size(), false);
    auto until = std::chrono::steady_clock::now() + deadline;
    std::size_t left = pids.size();
    for (std::size_t i = 0; i < pids.size(); ++i) done[i] = pids[i] <= 0;  // fork failed
    while (left > 0) {
      left = 0;
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        int st = 0;
        pid_t w = waitpid(pids[i], &st, WNOHANG);
        if (w == pids[i]) {
          done[i] = true;
          out[i].exited = WIFEXITED(st);
          out[i].code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
          out[i].signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        } else {
          ++left;
        }
      }
      if (left == 0) break;
      if (std::chrono::steady_clock::now() > until) {
        for (std::size_t i = 0; i < pids.size(); ++i) {
          if (done[i]) continue;
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          done[i] = true;
          out[i].overran = true;
        }
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    return out;
  }

  static void expect_all_ok(const std::vector<child_status>& st) {
    for (std::size_t i = 0; i < st.size(); ++i) {
      EXPECT_FALSE(st[i].overran) << "child " << i << " overran the deadline (hang)";
      EXPECT_TRUE(st[i].exited) << "child " << i << " killed by signal " << st[i].signal;
      EXPECT_EQ(st[i].code, 0) << "child " << i << " failed with exit code " << st[i].code;
    }
  }

  std::string dir_;
};

// Values chosen so every sum is a small integer (exact in float, whatever the reduction order).
float reduce_input(int rank, std::size_t i) { return static_cast<float>(rank + 1) + static_cast<float>(i % 97); }
float reduce_expected(int size, std::size_t i) {
  return static_cast<float>(size * (size + 1) / 2) + static_cast<float>(size) * static_cast<float>(i % 97);
}
float gather_input(int rank, std::size_t i) { return static_cast<float>(rank * 1000) + static_cast<float>(i % 13); }
float broadcast_root_value(std::size_t i) { return 7.0f + 0.5f * static_cast<float>(i % 31); }

#define CHILD_CHECK(cond, code)                                                          \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "rank %d: check failed (%d): %s\n", rank, code, #cond);       \
      return code;                                                                       \
    }                                                                                    \
  } while (0)

// One rank's part of the full exercise: connect, then for each length all_reduce_sum, all_gather and
// broadcast from root 1 (root 0 when alone), checking every element.
int exercise(const gloo_options& o) {
  const int rank = o.rank;
  auto comm = connect_gloo(o);
  if (!comm) {
    std::fprintf(stderr, "rank %d: connect: %s\n", rank, comm.error().message().c_str());
    return 2;
  }
  communicator& c = **comm;
  CHILD_CHECK(c.rank() == o.rank && c.size() == o.size, 3);
  const int size = o.size;
  const int root = size > 1 ? 1 : 0;
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{100000}}) {
    std::vector<float> data(n);
    for (std::size_t i = 0; i < n; ++i) data[i] = reduce_input(rank, i);
    auto r = c.all_reduce_sum(data);
    if (!r) std::fprintf(stderr, "rank %d: all_reduce_sum: %s\n", rank, r.error().message().c_str());
    CHILD_CHECK(r.has_value(), 10);
    for (std::size_t i = 0; i < n; ++i) CHILD_CHECK(data[i] == reduce_expected(size, i), 11);

    std::vector<float> mine(n), all(n * static_cast<std::size_t>(size), -1.0f);
    for (std::size_t i = 0; i < n; ++i) mine[i] = gather_input(rank, i);
    auto g = c.all_gather(mine, all);
    if (!g) std::fprintf(stderr, "rank %d: all_gather: %s\n", rank, g.error().message().c_str());
    CHILD_CHECK(g.has_value(), 20);
    for (int from = 0; from < size; ++from)
      for (std::size_t i = 0; i < n; ++i)
        CHILD_CHECK(all[static_cast<std::size_t>(from) * n + i] == gather_input(from, i), 21);

    std::vector<float> b(n, -1.0f);
    if (rank == root)
      for (std::size_t i = 0; i < n; ++i) b[i] = broadcast_root_value(i);
    auto br = c.broadcast(b, root);
    if (!br) std::fprintf(stderr, "rank %d: broadcast: %s\n", rank, br.error().message().c_str());
    CHILD_CHECK(br.has_value(), 30);
    for (std::size_t i = 0; i < n; ++i) CHILD_CHECK(b[i] == broadcast_root_value(i), 31);
  }
  // A second all_reduce on the same buffer after the others: collectives compose in sequence.
  std::vector<float> again(7, 1.0f);
  auto again_r = c.all_reduce_sum(again);
  if (!again_r) std::fprintf(stderr, "rank %d: all_reduce_sum again: %s\n", rank, again_r.error().message().c_str());
  CHILD_CHECK(again_r.has_value(), 40);
  for (float v : again) CHILD_CHECK(v == static_cast<float>(size), 41);
  return 0;
}

TEST_F(collectives, two_ranks) {
  auto st = run_ranks({0, 1}, [&](int r) { return exercise(options(r, 2, "two")); });
  expect_all_ok(st);
}

TEST_F(collectives, four_ranks) {
  auto st = run_ranks({0, 1, 2, 3}, [&](int r) { return exercise(options(r, 4, "four")); });
  expect_all_ok(st);
}

TEST_F(collectives, one_rank_is_local) {
  auto st = run_ranks({0}, [&](int r) { return exercise(options(r, 1, "one")); });
  expect_all_ok(st);
}

TEST_F(collectives, peer_that_never_joins_is_a_timeout) {
  // Size 2, only rank 0 starts: connect must come back with a timeout error, not hang. Gloo's
  // FileStore rounds the elapsed time down to whole seconds, so a 2 s timeout ends within ~3 s.
  auto st = run_ranks({0}, [&](int rank) {
    auto start = std::chrono::steady_clock::now();
    auto comm = connect_gloo(options(rank, 2, "alone", 2s));
    auto took = std::chrono::steady_clock::now() - start;
    CHILD_CHECK(!comm.has_value(), 2);
    std::fprintf(stderr, "rank %d: connect alone -> %s after %lld ms\n", rank, comm.error().message().c_str(),
                 static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
    CHILD_CHECK(comm.error().code == collective_error_code::timeout, 3);
    CHILD_CHECK(took >= 1500ms, 4);
    CHILD_CHECK(took < 10s, 5);
    return 0;
  }, 30s);
  expect_all_ok(st);
}

TEST_F(collectives, peer_that_leaves_makes_the_next_collective_an_error) {
  // Rank 1 connects and exits at once; rank 0's connect or next collective must fail (typed), within
  // the timeout, and the process must survive (no SIGPIPE death).
  auto st = run_ranks({0, 1}, [&](int rank) {
    auto comm = connect_gloo(options(rank, 2, "leaves", 3s));
    if (rank == 1) return comm ? 0 : 2;
    if (!comm) return 0;  // rank 1 left during the handshake: also a typed error
    auto start = std::chrono::steady_clock::now();
    std::vector<float> data(100000, 1.0f);
    // A few attempts: the first may still be buffered by the kernel before the close is seen.
    bool failed = false;
    for (int attempt = 0; attempt < 5 && !failed; ++attempt) {
      auto r = (*comm)->all_reduce_sum(data);
      if (!r) {
        std::fprintf(stderr, "rank 0: after peer left -> %s\n", r.error().message().c_str());
        failed = true;
      }
    }
    CHILD_CHECK(failed, 3);
    CHILD_CHECK(std::chrono::steady_clock::now() - start < 20s, 4);
    return 0;
  }, 60s);
  expect_all_ok(st);
}

TEST_F(collectives, peer_that_stalls_makes_the_collective_a_timeout) {
  // Both ranks connect; rank 1 then never calls the collective. Rank 0's all_reduce_sum must come
  // back with a timeout error after about the 2 s timeout.
  auto st = run_ranks({0, 1}, [&](int rank) {
    auto comm = connect_gloo(options(rank, 2, "stalls", 2s));
    CHILD_CHECK(comm.has_value(), 2);
    if (rank == 1) {
      std::this_thread::sleep_for(4s);
      return 0;
    }
    std::vector<float> data(7, 1.0f);
    auto start = std::chrono::steady_clock::now();
    auto r = (*comm)->all_reduce_sum(data);
    auto took = std::chrono::steady_clock::now() - start;
    CHILD_CHECK(!r.has_value(), 3);
    std::fprintf(stderr, "rank 0: stalled all_reduce -> %s after %lld ms\n", r.error().message().c_str(),
                 static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
    CHILD_CHECK(r.error().code == collective_error_code::timeout, 4);
    CHILD_CHECK(took >= 1500ms && took < 6s, 5);
    return 0;
  }, 60s);
  expect_all_ok(st);
}

TEST_F(collectives, bad_arguments_are_typed_refusals) {
  auto st = run_ranks({0}, [&](int rank) {
    CHILD_CHECK(connect_gloo(options(2, 2, "bad")).error().code == collective_error_code::invalid_argument, 2);
    CHILD_CHECK(connect_gloo(options(0, 0, "bad")).error().code == collective_error_code::invalid_argument, 3);
    auto o = options(0, 1, "bad");
    o.rendezvous_dir = dir_ + "/missing";
    CHILD_CHECK(connect_gloo(o).error().code == collective_error_code::invalid_argument, 4);
    auto comm = connect_gloo(options(0, 1, "bad-ok"));
    CHILD_CHECK(comm.has_value(), 5);
    std::vector<float> d(3, 1.0f), all(5);
    CHILD_CHECK((*comm)->broadcast(d, 1).error().code == collective_error_code::invalid_argument, 6);
    CHILD_CHECK((*comm)->broadcast(d, -1).error().code == collective_error_code::invalid_argument, 7);
    CHILD_CHECK((*comm)->all_gather(d, all).error().code == collective_error_code::invalid_argument, 8);
    return 0;
  });
  expect_all_ok(st);
}

// Point to point between two processes: messages of one pair arrive whole and in the order sent, both
// ways; a length that differs is an error, not a short read.
TEST_F(collectives, send_and_recv_pass_messages_in_order) {
  auto st = run_ranks({0, 1}, [&](int rank) {
    auto comm = connect_gloo(options(rank, 2, "p2p"));
    CHILD_CHECK(comm.has_value(), 2);
    const int peer = 1 - rank;
    for (int m = 0; m < 3; ++m) {
      std::vector<float> out(static_cast<std::size_t>(5 + m * 1000), static_cast<float>(rank * 100 + m)), in(out.size(), -1.0f);
      if (rank == 0) {
        CHILD_CHECK((*comm)->send(out, peer).has_value(), 3);
        CHILD_CHECK((*comm)->recv(in, peer).has_value(), 4);
      } else {
        CHILD_CHECK((*comm)->recv(in, peer).has_value(), 5);
        CHILD_CHECK((*comm)->send(out, peer).has_value(), 6);
      }
      for (float v : in) CHILD_CHECK(v == static_cast<float>(peer * 100 + m), 7);
    }
    std::vector<float> x(4, 1.0f);
    CHILD_CHECK((*comm)->send(x, rank).error().code == collective_error_code::invalid_argument, 8);
    CHILD_CHECK((*comm)->recv(x, 2).error().code == collective_error_code::invalid_argument, 9);
    return 0;
  });
  expect_all_ok(st);
}

// Tensor, pipeline and tensor x pipeline parallelism across processes: one forked process per rank,
// each loading its part of a 4-layer fixture (model_handle::part) on its own CPU executor; the ranks of
// a stage all_reduce through one Gloo group, the same rank of consecutive stages passes the residual
// stream through another (pipe_send / pipe_recv over loopback TCP). The last stage picks each greedy
// token and sends it back to the first stage's rank over the pipe, as a driver hands every stage the
// step's tokens. The parent then runs the unsplit model: the same 12 tokens, the last logits within
// 1e-3 in log-probability (bit for bit with stages alone). For llama (GGUF), qwen3 and gemma2, at 2 and
// 4 ranks, 2 stages and 2 x 2.
class split_processes : public collectives, public ::testing::WithParamInterface<std::string_view> {};

TEST_P(split_processes, give_one_devices_tokens_and_logits) {
  namespace fs = std::filesystem;
  const std::string family(GetParam());
  auto d = troupe::testing::tp_dims();
  d.layers = 4;
  const bool gguf = family == "llama";
  const fs::path model = fs::path(dir_) / (family + (gguf ? ".gguf" : ""));
  ASSERT_TRUE(families::write_fixture(family, d, model, gguf));
  const auto prompt = troupe::testing::split_prompt(d.vocab);
  constexpr int steps = 12;
  using troupe::testing::argmax;
  const std::vector<std::pair<int, int>> splits{{2, 1}, {4, 1}, {1, 2}, {2, 2}};
  for (const auto& [tp, pp] : splits) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
    const std::string tag = "t" + std::to_string(tp) + "p" + std::to_string(pp);
    std::vector<int> world;
    for (int w = 0; w < tp * pp; ++w) world.push_back(w);
    auto st = run_ranks(world, [&](int rank) {
      const int w = rank, s = w / tp, t = w % tp;
      const bool first = s == 0, last = s == pp - 1;
      std::unique_ptr<troupe::collective> group, pipe;
      if (tp > 1) {
        auto g = connect_gloo(options(t, tp, tag + "-stage" + std::to_string(s)));
        CHILD_CHECK(g.has_value(), 2);
        group = as_collective(std::move(*g));
      }
      if (pp > 1) {
        auto p = connect_gloo(options(s, pp, tag + "-pipe" + std::to_string(t)));
        CHILD_CHECK(p.has_value(), 3);
        pipe = as_collective(std::move(*p));
      }
      auto whole = families::model_handle::load(model, families::registry::builtin());
      CHILD_CHECK(whole.has_value(), 4);
      auto part = (*whole)->part(t, tp, s, pp);
      CHILD_CHECK(part.has_value(), 5);
      exec::cpu::cpu_executor ex({1, std::nullopt, group.get(), pipe.get()});
      auto run = app::exec_runner::create(*part, ex, 64);
      CHILD_CHECK(run.has_value(), 6);
      std::vector<std::int32_t> tokens;
      std::vector<float> last_logits;
      auto l = run->feed(prompt);
      for (int step = 0; step < steps && l; ++step) {
        std::int32_t next = 0;
        if (last) {
          next = argmax(*l);
          last_logits = *l;
          const float token[] = {static_cast<float>(next)};
          if (!first) CHILD_CHECK(pipe->send(token, 0).has_value(), 7);
        } else {
          CHILD_CHECK(l->empty(), 8);  // a stage before the last holds no head
          float token[] = {-1.0f};
          CHILD_CHECK(pipe->recv(token, pp - 1).has_value(), 9);
          next = static_cast<std::int32_t>(token[0]);
        }
        tokens.push_back(next);
        const std::int32_t feed[] = {next};
        l = run->feed(feed);
      }
      if (!l) std::fprintf(stderr, "rank %d: %s\n", w, l.error().c_str());
      CHILD_CHECK(l.has_value(), 10);
      FILE* f = std::fopen((fs::path(dir_) / (tag + "-rank" + std::to_string(w))).c_str(), "wb");
      CHILD_CHECK(f != nullptr, 11);
      std::fwrite(tokens.data(), sizeof(std::int32_t), tokens.size(), f);
      if (!last_logits.empty()) std::fwrite(last_logits.data(), sizeof(float), last_logits.size(), f);  // stages before the last have none
      std::fclose(f);
      return 0;
    });
    expect_all_ok(st);
  }

  auto whole = families::model_handle::load(model, families::registry::builtin());
  ASSERT_TRUE(whole);
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto run = app::exec_runner::create(*whole, ex, 64);
  ASSERT_TRUE(run) << run.error();
  std::vector<std::int32_t> want_tokens;
  std::vector<float> want;
  auto l = run->feed(prompt);
  for (int step = 0; step < steps && l; ++step) {
    want = *l;
    want_tokens.push_back(argmax(*l));
    const std::int32_t feed[] = {want_tokens.back()};
    l = run->feed(feed);
  }
  ASSERT_TRUE(l) << l.error();
  for (const auto& [tp, pp] : splits) {
    const std::string tag = "t" + std::to_string(tp) + "p" + std::to_string(pp);
    for (int w = 0; w < tp * pp; ++w) {
      SCOPED_TRACE(tag + " rank " + std::to_string(w));
      const bool last = w / tp == pp - 1;
      FILE* f = std::fopen((fs::path(dir_) / (tag + "-rank" + std::to_string(w))).c_str(), "rb");
      ASSERT_NE(f, nullptr) << "wrote nothing";
      std::vector<std::int32_t> tokens(steps);
      std::vector<float> logits(want.size());
      ASSERT_EQ(std::fread(tokens.data(), sizeof(std::int32_t), tokens.size(), f), tokens.size());
      const auto got_logits = std::fread(logits.data(), sizeof(float), logits.size(), f);
      std::fclose(f);
      EXPECT_EQ(tokens, want_tokens);
      if (!last) continue;
      ASSERT_EQ(got_logits, logits.size());
      const auto a = troupe::testing::log_softmax(want), b = troupe::testing::log_softmax(logits);
      double worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
      EXPECT_LT(worst, 1e-3);
      if (tp == 1) {
        EXPECT_EQ(logits, want) << "stages alone compute the whole model's ops in its order";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(families, split_processes, ::testing::Values("llama", "qwen3", "gemma2"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace troupe::transport

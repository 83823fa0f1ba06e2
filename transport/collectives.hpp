#pragma once
// Collective operations between the ranks of one tensor-parallel group (CPU replicas: Gloo over TCP;
// GPUs: NCCL, built where CUDA and NCCL are installed).
// Plain C++: no Gloo type appears here; Gloo stays inside gloo_communicator.cpp. Every failure (a
// peer that never joins, a peer that dies mid-collective, a bad argument) is a typed error, never an
// exception and never an unbounded wait: every wait is bounded by gloo_options::timeout.
//
// A communicator is used by one thread at a time, and every rank must call the same collectives in
// the same order with the same element counts. After any error other than invalid_argument the
// communicator is broken (peers may be mid-collective): drop it and connect a new group.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "engine/core/collective.hpp"
#include "engine/core/result.hpp"

namespace troupe::transport {

enum class collective_error_code : std::uint8_t {
  invalid_argument,  // bad rank/size/root, mismatched span sizes, missing rendezvous directory
  timeout,           // a peer did not join the rendezvous, or did not answer, within the timeout
  connect_failed,    // the rendezvous or the TCP connection failed for another reason
  transport,         // a collective failed (peer closed the connection, I/O error, ...)
};
std::string_view name(collective_error_code c);

struct collective_error {
  collective_error_code code;
  std::string reason;
  std::string message() const;
};

class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the element-wise sum over all ranks. Same length on every rank.
  virtual result<void, collective_error> all_reduce_sum(std::span<float> data) = 0;
  // `all` receives size() blocks of mine.size() floats, block r from rank r (all.size() must be
  // size() * mine.size()).
  virtual result<void, collective_error> all_gather(std::span<const float> mine, std::span<float> all) = 0;
  // In place: every rank ends with root's data. Same length on every rank.
  virtual result<void, collective_error> broadcast(std::span<float> data, int root) = 0;
  // Point to point: `data` to rank `to`; `data` filled from rank `from` (lengths agree). Messages of
  // one pair arrive in the order sent; both sides wait at most the timeout.
  virtual result<void, collective_error> send(std::span<const float> data, int to) = 0;
  virtual result<void, collective_error> recv(std::span<float> data, int from) = 0;
};

// A key-value store every rank of a group can reach, through which the ranks find each other (Gloo's
// addresses, NCCL's unique id): the coordinator's (actors::session::rendezvous_store), so ranks on
// different machines need no shared directory. Values are set once; `get` is nullopt until then.
class rendezvous_store {
 public:
  virtual ~rendezvous_store() = default;
  virtual result<void, std::string> set(const std::string& key, const std::string& value) = 0;
  virtual result<std::optional<std::string>, std::string> get(const std::string& key) = 0;
};

struct gloo_options {
  int rank = 0;
  int size = 1;
  // Rendezvous through `store` when given, else through a directory every rank can see (Gloo's
  // FileStore), which must exist.
  std::shared_ptr<rendezvous_store> store;
  std::string rendezvous_dir;
  // Keys are scoped by this prefix, so one directory can serve successive groups; it must be fresh
  // for each group (the same on every rank of the group), since Gloo refuses to overwrite a key.
  std::string prefix = "troupe";
  // The address (or hostname) this rank listens on; peers connect to it.
  std::string host = "127.0.0.1";
  // Bounds the rendezvous, the connection and each collective.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

// Joins the group: blocks until all size() ranks have joined (or the timeout passes).
result<std::unique_ptr<communicator>, collective_error> connect_gloo(const gloo_options& options);

struct nccl_options {
  int rank = 0;
  int size = 1;
  int device = 0;  // the CUDA device this rank uses (one rank per device)
  // Rank 0's NCCL unique id is handed to the others through `store` when given, else through a file in
  // `rendezvous_dir` (a directory every rank sees, as for Gloo); `prefix` must be fresh for each group.
  std::shared_ptr<rendezvous_store> store;
  std::string rendezvous_dir;
  std::string prefix = "troupe";
  // Bounds the id exchange, the group's creation and each collective (a stuck collective aborts the
  // communicator and comes back as a timeout).
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

// How many CUDA devices this process sees (0 without CUDA, a driver or a device).
int cuda_devices();

// Joins an NCCL group over GPUs (host buffers are staged through the device). A build without CUDA and
// NCCL refuses with connect_failed and says so.
result<std::unique_ptr<communicator>, collective_error> connect_nccl(const nccl_options& options);

// A communicator as the group a tensor-parallel shard's executor sums over (cpu_options::group,
// docs/tensor-parallel.md): ranks in separate processes or on separate machines.
std::unique_ptr<troupe::collective> as_collective(std::unique_ptr<communicator> c);

}  // namespace troupe::transport

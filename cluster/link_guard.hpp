#pragma once
// The guard in front of every cluster link. CAF 0.17's middleman trusts whatever reaches it: it
// delivers a message to any actor by its number and reserves whatever payload length a header claims.
// So no byte reaches it from the network directly. The coordinator's process listens here instead of
// in CAF: a connection is authenticated first (mutual TLS 1.3 against the cluster's CA; plain only when
// the operator said --insecure on loopback), bounded (pending handshakes and links in all and per
// address, a handshake deadline, a backoff for an address whose handshakes keep failing), and only then
// pumped to CAF over a Unix socket in a directory only this user can enter. A connecting process
// (node, session) dials through the same guard: its middleman gets one end of a socket pair, the other
// end is pumped to the TLS link. Both directions check CAF's framing (BASP's 32-byte header): a header
// that names an unknown operation or claims more than the largest legitimate payload ends the link
// before anything is reserved for it.
//
// No CAF here (cluster/guarded_middleman.cpp binds it to CAF's middleman).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/core/result.hpp"

namespace troupe::cluster {

struct tls_files {
  std::string certificate;  // PEM: this process's certificate (signed by the CA)
  std::string key;          // PEM: its private key
  std::string ca_file;      // PEM: the cluster's CA, which signs every process's certificate
  bool enabled() const { return !certificate.empty(); }
};

class tls_context;  // an OpenSSL context for one side of a link

// TLS 1.3 only; the peer's certificate is required and must chain to the CA; the own certificate and
// key must match. A typed refusal (a string naming the file and OpenSSL's reason) otherwise.
result<std::shared_ptr<tls_context>, std::string> server_tls(const tls_files& f);
result<std::shared_ptr<tls_context>, std::string> client_tls(const tls_files& f);

struct link_limits {
  // The largest payload a BASP frame may claim: a transport message at its decode limit (8 MiB) with
  // CAF's envelope around it. Every message troupe sends is a transport message or smaller.
  std::uint32_t max_frame_bytes = (8u << 20) + (64u << 10);
  // A connection that has sent nothing yet is "silent": it costs a descriptor and a few bytes, held by
  // the front's one event loop. When the silent ones reach a cap, the oldest is closed to make room
  // (per address first), so a flood of silent connections never locks a peer out: a real peer speaks
  // at once (a TLS ClientHello) and leaves the silent set within a round trip.
  int max_silent = 2048;              // in all (lowered to fit the process's descriptor limit)
  int max_silent_per_address = 512;
  // Connections that have spoken and run their handshake (TLS: an SSL object in the event loop;
  // plain: a thread waiting for the first frame). Past a cap the oldest handshake is closed (TLS) or
  // the newcomer refused (plain).
  int max_pending = 256;              // in all
  int max_pending_per_address = 64;
  int max_links = 1024;               // authenticated links, in all
  int max_links_per_address = 512;
  std::chrono::milliseconds handshake_deadline{5000};  // from the accept to an authenticated link
  int failures_before_backoff = 32;   // failed handshakes of one address within `backoff`...
  std::chrono::milliseconds backoff{10000};  // ...refuse it for this long
  // Backoff refuses an address. On loopback every local process shares one address, so a local flood
  // would lock the cluster's own nodes and clients out: loopback peers are bounded by the caps and
  // evictions above instead, unless this is set (tests).
  bool backoff_loopback = false;
};

struct link_counters {
  std::uint64_t accepted = 0, authenticated = 0;
  std::uint64_t refused_pending = 0, refused_links = 0, refused_backoff = 0;
  std::uint64_t evicted_silent = 0, evicted_pending = 0;  // closed to make room for a newer connection
  std::uint64_t handshake_failed = 0, handshake_timeout = 0, frames_refused = 0;
  std::int64_t pending = 0, links = 0;  // pending: silent and handshaking
};

// Checks a byte stream against BASP's framing: 32-byte headers (operation, two pad bytes, flags, the
// payload length as a big-endian u32, then 24 bytes of ids), each followed by its payload.
class frame_checker {
 public:
  explicit frame_checker(std::uint32_t max_payload) : max_(max_payload) {}
  // false at the first header that names an unknown operation or claims more than max_payload
  // (why() says which); true otherwise. Bytes after a refusal are not looked at.
  bool feed(const char* data, std::size_t n);
  std::uint64_t frames() const { return frames_; }  // complete frames seen
  const std::string& why() const { return why_; }

 private:
  std::uint32_t max_;
  unsigned char header_[32] = {};
  std::size_t have_ = 0;          // header bytes collected
  std::uint64_t payload_left_ = 0;
  std::uint64_t frames_ = 0;
  std::string why_;
};

class link_front {
 public:
  // Listens on host:port (0: a free port). Every connection is authenticated (TLS when `tls` is set,
  // else plain) within the limits and then pumped to the socket `inner` returns (CAF's side of a fresh
  // connection; -1 when there is none).
  static result<std::unique_ptr<link_front>, std::string> start(const std::string& host, int port, std::shared_ptr<tls_context> tls,
                                                                std::function<int()> inner, link_limits limits = {});
  ~link_front();
  int port() const;
  link_counters counters() const;

  struct impl;

 private:
  explicit link_front(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

// Opens a link to a front: TCP to host:port and the TLS handshake (plain when `tls` is null) within
// `deadline`. Returns one end of a loopback pair (non-blocking, the caller's to own), whose other end
// a thread pumps to and from the link until either side closes.
result<int, std::string> dial_link(const std::string& host, int port, std::shared_ptr<tls_context> tls, const link_limits& limits,
                                   std::chrono::milliseconds deadline);

// Two connected loopback TCP sockets (CAF's middleman takes only IP sockets): `ours` and `theirs`,
// non-blocking. The listener that joins them lives for the connect alone and takes only our own
// connecting socket (the peer's port is checked), so no other process gets in between.
struct socket_pair {
  int ours = -1, theirs = -1;
};
result<socket_pair, std::string> loopback_pair();

// True when every address `host` resolves to is a loopback address (127.0.0.0/8, ::1, "localhost").
bool is_loopback(const std::string& host);

}  // namespace troupe::cluster

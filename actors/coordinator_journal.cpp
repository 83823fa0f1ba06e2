// The coordinator's desired state on disk (`troupe coordinator --state-dir D`): every deployment's
// Deploy (served name, path, desired count, load template, goal) as length-prefixed envelopes, written
// whole to a temporary file, fsynced and renamed over the journal on every change, so a coordinator
// killed at any moment leaves the last committed state. A restarted coordinator reads it, resolves each
// checkpoint again and reconciles: the replicas are placed again as the nodes rejoin.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "actors/coordinator_state.hpp"
#include "transport/codec.hpp"

namespace troupe::actors::coord {

void save_journal(const state& st) {
  if (st.journal.empty()) return;
  std::string out;
  for (const auto& [name, d] : st.deployments) {
    const auto bytes = transport::encode(d.spec);
    const auto n = static_cast<std::uint64_t>(bytes.size());
    for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
    out += bytes;
  }
  const auto tmp = st.journal + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  bool ok = fd >= 0;
  for (std::size_t at = 0; ok && at < out.size();) {
    const auto w = ::write(fd, out.data() + at, out.size() - at);
    if (w <= 0) ok = false;
    else at += static_cast<std::size_t>(w);
  }
  ok = ok && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  ok = ok && std::rename(tmp.c_str(), st.journal.c_str()) == 0;
  if (!ok) spdlog::error("event=journal_write_failed path={}", st.journal);
}

std::vector<transport::deploy> load_journal(const std::string& path) {
  std::vector<transport::deploy> out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return out;
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (std::size_t at = 0; at + 8 <= all.size();) {
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(all[at + static_cast<std::size_t>(i)])) << (8 * i);
    at += 8;
    if (n > all.size() - at) {
      spdlog::warn("event=journal_truncated path={} at={}", path, at);
      break;
    }
    auto m = transport::decode(std::string_view(all).substr(at, n));
    at += n;
    if (m && std::holds_alternative<transport::deploy>(*m)) out.push_back(std::get<transport::deploy>(*m));
    else spdlog::warn("event=journal_entry_refused path={}", path);
  }
  return out;
}

}  // namespace troupe::actors::coord

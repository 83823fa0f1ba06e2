#include "engine/load/detail/spill_file.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

namespace troupe::load::detail {

namespace {

int open_unlinked(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0 || fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) return -1;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  // A file system without O_TMPFILE: a named file, unlinked at once.
  std::string name = dir + "/troupe-spill-XXXXXX";
  fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd >= 0) (void)::unlink(name.c_str());
  return fd;
}

}  // namespace

std::optional<spill_file> spill_file::create() {
  std::vector<std::string> dirs;
  for (const char* env : {"TROUPE_SPILL_DIR", "TMPDIR"})
    if (const char* v = std::getenv(env); v && *v) dirs.emplace_back(v);
  dirs.emplace_back("/var/tmp");
  dirs.emplace_back("/tmp");
  for (const auto& d : dirs)
    if (const int fd = open_unlinked(d); fd >= 0) return spill_file(fd, d);
  return std::nullopt;
}

spill_file::spill_file(spill_file&& o) noexcept : fd_(o.fd_), dir_(std::move(o.dir_)), size_(o.size_) { o.fd_ = -1; }

spill_file& spill_file::operator=(spill_file&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    dir_ = std::move(o.dir_);
    size_ = o.size_;
    o.fd_ = -1;
  }
  return *this;
}

spill_file::~spill_file() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::size_t> spill_file::append(std::span<const std::byte> bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t at = (size_ + page - 1) / page * page;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    done += static_cast<std::size_t>(n);
  }
  size_ = at + bytes.size();
  return at;
}

result<std::shared_ptr<const mapped_file>, load_error> spill_file::map() const {
  return mapped_file::open_descriptor(fd_, size_, dir_ + " (spill file)");
}

}  // namespace troupe::load::detail

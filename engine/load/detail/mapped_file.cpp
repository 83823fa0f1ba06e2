#include "engine/load/detail/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace troupe::load::detail {

result<std::shared_ptr<const mapped_file>, load_error> mapped_file::open(const std::filesystem::path& path) {
  const auto fail = [&](std::string reason) {
    return troupe::unexpected(load_error{load_error_code::io, path.string(), "", std::move(reason)});
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return fail(std::string("cannot stat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail("not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* addr = nullptr;
  if (size > 0) {
    addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return fail(std::string("cannot map: ") + std::strerror(e));
    }
  }
  // The mapping keeps the file's pages reachable; the descriptor is no longer needed.
  ::close(fd);
  return std::shared_ptr<const mapped_file>(new mapped_file(addr, size));
}

void release_pages(const std::byte* p, std::size_t n) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + n) / page * page;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

mapped_file::~mapped_file() {
  if (addr_) ::munmap(addr_, size_);
}

}  // namespace troupe::load::detail

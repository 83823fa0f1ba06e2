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
  auto m = open_descriptor(fd, static_cast<std::size_t>(st.st_size), path.string());
  // The mapping keeps the file's pages reachable; the descriptor is no longer needed.
  ::close(fd);
  return m;
}

result<std::shared_ptr<const mapped_file>, load_error> mapped_file::open_descriptor(int fd, std::size_t size, const std::string& what) {
  void* addr = nullptr;
  if (size > 0) {
    addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED)
      return troupe::unexpected(load_error{load_error_code::io, what, "", std::string("cannot map: ") + std::strerror(errno)});
    // A weight file is read once into the executor's own forms and then only here and there (an
    // embedding row, a norm): the kernel must not map a whole 2 MiB page-cache folio for such a touch
    // (it does for a PMD-aligned mapping of a large folio), or each stray read costs 2 MiB of resident set.
    (void)::madvise(addr, size, MADV_NOHUGEPAGE);
  }
  return std::shared_ptr<const mapped_file>(new mapped_file(addr, size));
}

void release_pages(const std::byte* p, std::size_t n, bool covering) {
  if (n == 0) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<std::uintptr_t>(p);
  const auto begin = covering ? first / page * page : (first + page - 1) / page * page;
  const auto end = covering ? (first + n + page - 1) / page * page : (first + n) / page * page;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

mapped_file::~mapped_file() {
  if (addr_) ::munmap(addr_, size_);
}

}  // namespace troupe::load::detail

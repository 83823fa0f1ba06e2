#include "engine/load/detail/file_writer.hpp"

#include <cerrno>
#include <cstring>
#include <utility>

namespace troupe::load::detail {

result<file_writer, load_error> file_writer::create(const std::filesystem::path& path) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    return troupe::unexpected(
        load_error{load_error_code::io, path.string(), "", std::string("cannot create: ") + std::strerror(errno)});
  return file_writer(path, std::move(tmp), f);
}

file_writer::file_writer(file_writer&& o) noexcept
    : path_(std::move(o.path_)), tmp_(std::move(o.tmp_)), file_(std::exchange(o.file_, nullptr)), errno_(o.errno_) {}

file_writer::~file_writer() {
  if (file_) {
    std::fclose(file_);
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
  }
}

void file_writer::write(std::span<const std::byte> bytes) {
  if (errno_ != 0 || bytes.empty()) return;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) errno_ = errno ? errno : EIO;
}

void file_writer::write_zeros(std::size_t n) {
  static constexpr std::byte zeros[256] = {};
  while (n > 0) {
    const std::size_t k = n < sizeof zeros ? n : sizeof zeros;
    write({zeros, k});
    n -= k;
  }
}

result<void, load_error> file_writer::commit() {
  const auto fail = [&](int e, const char* what) {
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
    return troupe::unexpected(load_error{load_error_code::io, path_.string(), "", std::string(what) + std::strerror(e)});
  };
  std::FILE* f = std::exchange(file_, nullptr);
  if (errno_ != 0) {
    std::fclose(f);
    return fail(errno_, "cannot write: ");
  }
  if (std::fclose(f) != 0) return fail(errno, "cannot write: ");
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) return fail(ec.value(), "cannot rename into place: ");
  return {};
}

}  // namespace troupe::load::detail

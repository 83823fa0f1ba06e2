#pragma once
// Writes a file under a temporary name and renames it into place on commit, so a reader never sees a
// half-written checkpoint and a failed write leaves no file behind.
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>

#include "engine/core/result.hpp"
#include "engine/load/load_error.hpp"

namespace troupe::load::detail {

class file_writer {
 public:
  static result<file_writer, load_error> create(const std::filesystem::path& path);

  file_writer(file_writer&& o) noexcept;
  file_writer& operator=(file_writer&&) = delete;
  file_writer(const file_writer&) = delete;
  ~file_writer();

  // A failed write is remembered and reported by commit().
  void write(std::span<const std::byte> bytes);
  void write_zeros(std::size_t n);
  result<void, load_error> commit();

 private:
  file_writer(std::filesystem::path path, std::filesystem::path tmp, std::FILE* f)
      : path_(std::move(path)), tmp_(std::move(tmp)), file_(f) {}
  std::filesystem::path path_;
  std::filesystem::path tmp_;
  std::FILE* file_ = nullptr;
  int errno_ = 0;  // the first write failure
};

}  // namespace troupe::load::detail

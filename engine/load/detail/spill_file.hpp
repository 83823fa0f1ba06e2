#pragma once
// A scratch file for forms a loader builds (the row form of a quantized Hugging Face checkpoint): it
// is unlinked from the start, written once, then mapped read-only. Its pages belong to the page cache,
// which the kernel writes out and drops under pressure, and an executor that has packed a weight drops
// them from the process (release_pages), so the built form costs no anonymous memory beside the packed
// one. A directory on tmpfs is passed over: there the pages would be memory all the same.
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "engine/core/result.hpp"
#include "engine/load/detail/mapped_file.hpp"
#include "engine/load/load_error.hpp"

namespace troupe::load::detail {

class spill_file {
 public:
  // In $TROUPE_SPILL_DIR, else $TMPDIR, else /var/tmp, else /tmp: the first of them that is a directory
  // on a disk-backed file system and takes a file. Nullopt where none does (the caller keeps its forms
  // in memory).
  static std::optional<spill_file> create();

  spill_file(spill_file&& o) noexcept;
  spill_file& operator=(spill_file&& o) noexcept;
  spill_file(const spill_file&) = delete;
  spill_file& operator=(const spill_file&) = delete;
  ~spill_file();

  // Writes `bytes` at the next page boundary and returns their offset; nullopt when the write fails
  // (a full disk), which leaves what was written before intact.
  std::optional<std::size_t> append(std::span<const std::byte> bytes);
  const std::string& directory() const { return dir_; }
  // Everything written, mapped read-only (null for an empty file).
  result<std::shared_ptr<const mapped_file>, load_error> map() const;

 private:
  spill_file(int fd, std::string dir) : fd_(fd), dir_(std::move(dir)) {}
  int fd_ = -1;
  std::string dir_;
  std::size_t size_ = 0;
};

}  // namespace troupe::load::detail

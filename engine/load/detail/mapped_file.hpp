#pragma once
// A whole file mapped read-only into memory. Readers hand out tensor views into the mapping, so the
// mapping is shared: it lives as long as the last reader or weight store that holds it. Changing the
// file on disk while it is mapped is outside what a reader can defend against.
#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "engine/core/result.hpp"
#include "engine/load/load_error.hpp"

namespace troupe::load::detail {

class mapped_file {
 public:
  static result<std::shared_ptr<const mapped_file>, load_error> open(const std::filesystem::path& path);
  // The first `size` bytes of an open descriptor (which stays the caller's); `what` names it in errors.
  static result<std::shared_ptr<const mapped_file>, load_error> open_descriptor(int fd, std::size_t size, const std::string& what);

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file();

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(addr_), size_}; }

 private:
  mapped_file(void* addr, std::size_t size) : addr_(addr), size_(size) {}
  void* addr_ = nullptr;  // null for an empty file, which cannot be mapped
  std::size_t size_ = 0;
};

// Drops the pages wholly inside [p, p + n) of a read-only file mapping from this process's resident set
// (the kernel reads them back from the file on a later touch): for bytes copied into another form.
// `covering`: every page the bytes touch, the ones they share with their neighbours too (for small
// tensors, which cover no whole page; a neighbour read later faults its page back in).
void release_pages(const std::byte* p, std::size_t n, bool covering = false);

}  // namespace troupe::load::detail

#pragma once
// Line and column of a byte offset in a template source, for error messages. Queries usually move
// forward through the source, so the last answer is the starting point of the next.
#include <cstdint>
#include <string_view>
#include <utility>

namespace troupe::text::jinja::detail {

class source_positions {
 public:
  explicit source_positions(std::string_view source) : source_(source) {}

  std::size_t size() const { return source_.size(); }

  // 1-based line and column (in code points) of the byte at offset; the end of the source for an
  // offset past it.
  std::pair<std::uint32_t, std::uint32_t> locate(std::size_t offset) {
    if (offset > source_.size()) offset = source_.size();
    if (offset < offset_) offset_ = 0, line_ = 1, column_ = 1;
    for (; offset_ < offset; ++offset_) {
      const auto c = static_cast<unsigned char>(source_[offset_]);
      if (c == '\n') {
        ++line_;
        column_ = 1;
      } else if ((c & 0xC0) != 0x80) {
        ++column_;
      }
    }
    return {line_, column_};
  }

 private:
  std::string_view source_;
  std::size_t offset_ = 0;
  std::uint32_t line_ = 1;
  std::uint32_t column_ = 1;
};

}  // namespace troupe::text::jinja::detail

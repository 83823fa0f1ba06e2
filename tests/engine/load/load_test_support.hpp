#pragma once
// Shared by the load-layer tests: a fresh temporary directory per test, whole-file byte helpers, and
// the check every malformed-input test makes (the error's class, and that it names file and item).
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "engine/load/load_error.hpp"

namespace troupe::load::testing {

class temp_dir {
 public:
  temp_dir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("troupe-load-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
             std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::byte> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) out[i] = static_cast<std::byte>(c[i]);
  return out;
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::filesystem::path& p, std::string_view text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

// A byte pattern that differs per tensor, so a view pointing at the wrong tensor's bytes is caught.
inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 131 + seed * 17 + 7) & 0xff);
  return out;
}

// The failure must be of class `code` and name the file and the item, in the fields and the message.
template <class R>
void expect_load_error(const R& r, load_error_code code, const std::string& file, const std::string& item) {
  ASSERT_FALSE(r.has_value()) << "expected " << name(code) << " for '" << item << "'";
  const load_error& e = r.error();
  EXPECT_EQ(name(e.code), name(code)) << e.message();
  EXPECT_EQ(e.file, file) << e.message();
  EXPECT_EQ(e.item, item) << e.message();
  EXPECT_FALSE(e.reason.empty());
  const std::string m = e.message();
  EXPECT_NE(m.find(file), std::string::npos) << m;
  EXPECT_NE(m.find(item), std::string::npos) << m;
  EXPECT_NE(m.find(name(code)), std::string::npos) << m;
}

}  // namespace troupe::load::testing

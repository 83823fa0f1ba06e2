// The loader's spill file: unlinked, written at page boundaries, mapped back; tmpfs passed over.
#include "engine/load/detail/spill_file.hpp"

#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tests/engine/load/load_test_support.hpp"

namespace troupe::load::detail {
namespace {

using testing::pattern;
using testing::temp_dir;

bool on_tmpfs(const std::filesystem::path& p) {
  struct statfs fs {};
  return ::statfs(p.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

TEST(spill_file, writes_at_page_boundaries_and_maps_back_what_it_wrote) {
  temp_dir dir;
  if (on_tmpfs(dir.path())) GTEST_SKIP() << "the test directory is on tmpfs, which a spill passes over";
  ::setenv("TROUPE_SPILL_DIR", dir.path().c_str(), 1);
  auto s = spill_file::create();
  ::unsetenv("TROUPE_SPILL_DIR");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->directory(), dir.path().string());
  // Unlinked from the start: nothing is left behind in the directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  const auto a = pattern(100, 1), b = pattern(5000, 2), c = pattern(1, 3);
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto oa = s->append(a), ob = s->append(b), oc = s->append(c);
  ASSERT_TRUE(oa && ob && oc);
  EXPECT_EQ(*oa, 0u);
  EXPECT_EQ(*ob, page);
  EXPECT_EQ(*oc, (page + 5000 + page - 1) / page * page);
  auto m = s->map();
  ASSERT_TRUE(m) << m.error().message();
  const auto bytes = (*m)->bytes();
  ASSERT_EQ(bytes.size(), *oc + 1);
  EXPECT_EQ(std::memcmp(bytes.data() + *oa, a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + *ob, b.data(), b.size()), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + *oc, c.data(), c.size()), 0);
  // Dropping the pages loses nothing: they are read back from the file.
  release_pages(bytes.data(), bytes.size(), true);
  EXPECT_EQ(std::memcmp(bytes.data() + *ob, b.data(), b.size()), 0);
}

TEST(spill_file, passes_over_tmpfs_and_missing_directories) {
  ::setenv("TROUPE_SPILL_DIR", "/nonexistent/troupe", 1);
  auto s = spill_file::create();
  if (s) {
    EXPECT_NE(s->directory(), "/nonexistent/troupe");
  }
  if (on_tmpfs("/dev/shm")) {
    ::setenv("TROUPE_SPILL_DIR", "/dev/shm", 1);
    auto t = spill_file::create();
    if (t) {
      EXPECT_NE(t->directory(), "/dev/shm");
    }
  }
  ::unsetenv("TROUPE_SPILL_DIR");
}

}  // namespace
}  // namespace troupe::load::detail

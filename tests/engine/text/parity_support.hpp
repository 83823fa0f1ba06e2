#pragma once
// What the parity tests share: a deterministic random source, finding the repository and the installed
// reference packages, running tests/reference/render_template.mjs over a batch of cases, and comparing
// its results with troupe's byte for byte (printing the case and a readable diff on a mismatch).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace troupe::text::testing {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// splitmix64: the same cases on every platform (std distributions differ between libraries).
class rng {
 public:
  explicit rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
  bool chance(int percent) { return below(100) < static_cast<std::size_t>(percent); }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  std::uint64_t s_;
};

// A stable seed from a name (FNV-1a).
std::uint64_t seed_of(const std::string& name);

// The repository root (found from the working directory up); empty when not found.
fs::path repo_root();
bool references_installed(const fs::path& root);

#define TROUPE_REQUIRE_REFERENCES()                                                                   \
  const ::troupe::text::testing::fs::path root = ::troupe::text::testing::repo_root();               \
  if (!::troupe::text::testing::references_installed(root))                                          \
    GTEST_SKIP() << "the reference packages are not installed: run scripts/install-references (the " \
                    "ctest fixture `references` does)"

struct parity_stats {
  int rendered = 0;          // both rendered the same bytes
  int raised = 0;            // both raised
  int beyond_reference = 0;  // the reference raised, troupe rendered (a Jinja feature troupe adds)
};

// Each case is a JSON object {template, messages, tools, add_generation_prompt, bos_token, eos_token,
// kwargs, label}. strict: errors must agree both ways; otherwise troupe may render what the
// reference refuses. Mismatches are reported as test failures.
parity_stats expect_parity(const fs::path& root, const std::vector<json>& cases, bool strict);

}  // namespace troupe::text::testing

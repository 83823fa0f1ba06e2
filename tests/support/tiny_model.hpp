#pragma once
// The small llama-shaped GGUF the actor, gateway and client tests serve: vocab 512, hidden 128, ffn 256,
// 2 layers, 4 heads over 2 KV heads of 32, random weights, the fixture tokenizer and chat template.
// Written once per test process under the temporary directory; tiny_cluster_options serves it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cluster/local_cluster.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/driver_fixture.hpp"

namespace troupe::test {

inline std::filesystem::path tiny_llama_gguf(const std::string& file = "tiny.gguf") {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("troupe-tiny-" + std::to_string(::getpid()));
  const auto path = dir / file;
  if (fs::exists(path)) return path;
  fs::create_directories(dir);
  auto w = families::write_fixture("llama", small_dims(), path, true);
  EXPECT_TRUE(w) << (w ? "" : w.error().message());
  return path;
}

// A local cluster of `replicas` drivers sized for the tiny model (8 rows of 256 positions).
inline actors::cluster_options tiny_cluster_options(std::int32_t replicas) {
  actors::cluster_options o;
  o.replicas = replicas;
  o.driver.max_rows = 8;
  o.driver.capacity = 256;
  o.driver.block_size = 16;
  o.driver.prefill_chunk = 64;
  o.driver.token_budget = 128;
  return o;
}

}  // namespace troupe::test

#pragma once
// The small llama-shaped GGUF the actor, gateway and client tests serve: vocab 512, hidden 128, ffn 256,
// 2 layers, 4 heads over 2 KV heads of 32, random weights, the fixture tokenizer and chat template.
// Written once per test process under the temporary directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "families/fixtures/fixture.hpp"

namespace troupe::test {

inline std::filesystem::path tiny_llama_gguf(const std::string& file = "tiny.gguf") {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("troupe-tiny-" + std::to_string(::getpid()));
  const auto path = dir / file;
  if (fs::exists(path)) return path;
  families::fixture_dims d;
  d.vocab = 512;
  d.hidden = 128;
  d.ffn = 256;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 32;
  d.layers = 2;
  fs::create_directories(dir);
  auto w = families::write_fixture("llama", d, path, true);
  EXPECT_TRUE(w) << (w ? "" : w.error().message());
  return path;
}

}  // namespace troupe::test

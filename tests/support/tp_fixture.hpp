#pragma once
// The fixture shape the tensor-parallel tests split: 4 query heads over 2 key/value heads (so 4 ranks
// share each key/value head), widths that split 2 and 4 ways on q8_0 block boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"

namespace troupe::testing {

inline families::fixture_dims tp_dims(dtype matrices = dtype::f32) {
  families::fixture_dims d;
  d.vocab = 384;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 32;
  d.hidden = 128;
  d.ffn = 256;
  d.layers = 2;
  d.matrix_type = matrices;
  return d;
}

// The fixture `family` of `dims` written under `name` in the temporary directory and loaded.
inline std::shared_ptr<const families::model_handle> load_split_fixture(std::string_view family, const families::fixture_dims& dims,
                                                                        const std::string& name, bool gguf) {
  const auto path = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + (gguf ? ".gguf" : ""));
  EXPECT_TRUE(families::write_fixture(family, dims, path, gguf));
  auto h = families::model_handle::load(path, families::registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  return h ? *h : nullptr;
}

// The split tests' prompt: `len` ids spread over the vocabulary, clear of the first three.
inline std::vector<std::int32_t> split_prompt(std::int64_t vocab, int len = 12) {
  std::vector<std::int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<std::int32_t>(3 + (i * 97 + 11) % (vocab - 3)));
  return p;
}

inline std::int32_t argmax(const std::vector<float>& l) {
  return static_cast<std::int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

}  // namespace troupe::testing

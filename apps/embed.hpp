#pragma once
// `troupe embed`: embeddings of texts (each --input, or each line of stdin) through the driver's encode
// program, pooled as the model declares (families/pooling.hpp) unless --pooling says otherwise. Prints
// one JSON object: {"model", "pooling", "normalize", "data": [{"index", "tokens", "embedding"}]}.
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::app {

struct embed_options {
  std::string model;
  std::vector<std::string> inputs;  // empty: the lines of stdin
  std::string pooling;              // mean, cls, last; empty: the model's
  bool no_normalize = false;
  std::int64_t threads = 0;
};
int run_embed(const embed_options& opt);

}  // namespace troupe::app

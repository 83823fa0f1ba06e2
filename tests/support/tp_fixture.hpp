#pragma once
// The fixture shape the tensor-parallel tests split: 4 query heads over 2 key/value heads (so 4 ranks
// share each key/value head), widths that split 2 and 4 ways on q8_0 block boundaries.
#include "families/fixtures/fixture.hpp"

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

}  // namespace troupe::testing

#include "engine/graph/ops.hpp"

#include <gtest/gtest.h>

namespace troupe::graph {
namespace {

tensor_type t(dtype d, std::initializer_list<std::int64_t> s) { return {d, troupe::shape(s)}; }
tensor_type f32(std::initializer_list<std::int64_t> s) { return t(dtype::f32, s); }

tensor_type ok(op o, std::vector<tensor_type> in, op_attrs a = {}) {
  auto r = infer(o, in, a);
  EXPECT_TRUE(r) << op_name(o) << ": " << (r ? "" : r.error());
  return r ? *r : tensor_type{};
}

bool refused(op o, std::vector<tensor_type> in, op_attrs a = {}) { return !infer(o, in, a); }

TEST(infer, elementwise_broadcasts_numpy_style) {
  EXPECT_EQ(ok(op::add, {f32({3, 1, 5}), f32({4, 1})}), f32({3, 4, 5}));
  EXPECT_EQ(ok(op::mul, {f32({}), f32({2, 3})}), f32({2, 3}));
  EXPECT_EQ(ok(op::less, {f32({1}), f32({7})}), t(dtype::boolean, {7}));
  EXPECT_TRUE(refused(op::add, {f32({3}), f32({4})}));
  EXPECT_TRUE(refused(op::add, {f32({3}), t(dtype::f16, {3})}));
  EXPECT_TRUE(refused(op::exp, {t(dtype::i32, {3})}));
  EXPECT_TRUE(refused(op::add, {t(dtype::q8_0, {32}), t(dtype::q8_0, {32})}));
  EXPECT_EQ(ok(op::where, {t(dtype::boolean, {1, 3}), f32({2, 1}), f32({})}), f32({2, 3}));
}

TEST(infer, reductions_and_axes) {
  op_attrs a;
  a.axis = -1;
  EXPECT_EQ(ok(op::reduce_sum, {f32({2, 7})}, a), f32({2}));
  a.keepdim = true;
  EXPECT_EQ(ok(op::reduce_max, {f32({2, 7})}, a), f32({2, 1}));
  EXPECT_EQ(ok(op::arg_max, {f32({1, 7})}, a), t(dtype::i32, {1, 1}));
  a.axis = 2;
  EXPECT_TRUE(refused(op::reduce_sum, {f32({2, 7})}, a));
  a.axis = 0;
  EXPECT_TRUE(refused(op::reduce_max, {f32({0, 7})}, a));
}

TEST(infer, movement) {
  op_attrs a;
  a.target = troupe::shape{3, 2};
  EXPECT_EQ(ok(op::reshape, {f32({6})}, a), f32({3, 2}));
  a.target = troupe::shape{4, 2};
  EXPECT_TRUE(refused(op::reshape, {f32({6})}, a));
  op_attrs p;
  p.ints = {2, 0, 1};
  EXPECT_EQ(ok(op::transpose, {f32({2, 3, 5})}, p), f32({5, 2, 3}));
  p.ints = {0, 0, 1};
  EXPECT_TRUE(refused(op::transpose, {f32({2, 3, 5})}, p));
  op_attrs s;
  s.axis = 1;
  s.ints = {1, 3};
  EXPECT_EQ(ok(op::slice, {f32({2, 3})}, s), f32({2, 2}));
  s.ints = {2, 4};
  EXPECT_TRUE(refused(op::slice, {f32({2, 3})}, s));
  op_attrs c;
  c.axis = 0;
  EXPECT_EQ(ok(op::concat, {f32({1, 3}), f32({2, 3})}, c), f32({3, 3}));
  EXPECT_TRUE(refused(op::concat, {f32({1, 3}), f32({2, 4})}, c));
  op_attrs b;
  b.target = troupe::shape{4, 3};
  EXPECT_EQ(ok(op::broadcast, {f32({1, 3})}, b), f32({4, 3}));
  EXPECT_TRUE(refused(op::broadcast, {f32({2, 3})}, b));
}

TEST(infer, products_gathers_and_structured_ops) {
  EXPECT_EQ(ok(op::matmul, {f32({2, 3, 4}), f32({2, 4, 5})}), f32({2, 3, 5}));
  EXPECT_TRUE(refused(op::matmul, {f32({2, 3, 4}), f32({3, 4, 5})}));
}

TEST(infer, routing_ops) {
  op_attrs k2;
  k2.ints = {2};
  EXPECT_EQ(ok(op::top_k, {f32({5, 8})}, k2), t(dtype::i32, {5, 2}));
  EXPECT_TRUE(refused(op::top_k, {f32({5, 8})}));                  // no k
  op_attrs k9;
  k9.ints = {9};
  EXPECT_TRUE(refused(op::top_k, {f32({5, 8})}, k9));              // k past E
  EXPECT_TRUE(refused(op::top_k, {t(dtype::i32, {5, 8})}, k2));    // float scores only
  EXPECT_EQ(ok(op::take_along, {f32({5, 8}), t(dtype::i32, {5, 2})}), f32({5, 2}));
  EXPECT_TRUE(refused(op::take_along, {f32({5, 8}), t(dtype::i32, {4, 2})}));
  EXPECT_TRUE(refused(op::take_along, {f32({5, 8}), f32({5, 2})}));
  EXPECT_EQ(ok(op::linear_id, {f32({5, 256}), t(dtype::q4_k, {8, 3, 256}), t(dtype::i32, {5, 2})}), f32({5, 2, 3}));
  EXPECT_EQ(ok(op::linear_id, {f32({5, 2, 64}), f32({8, 3, 64}), t(dtype::i64, {5, 2})}), f32({5, 2, 3}));
  EXPECT_TRUE(refused(op::linear_id, {f32({5, 3, 64}), f32({8, 3, 64}), t(dtype::i32, {5, 2})}));  // x per pick, wrong k
  EXPECT_TRUE(refused(op::linear_id, {f32({5, 64}), f32({3, 64}), t(dtype::i32, {5, 2})}));        // w not [E, N, K]
  EXPECT_TRUE(refused(op::linear_id, {f32({5, 64}), f32({8, 3, 32}), t(dtype::i32, {5, 2})}));     // K differs
  EXPECT_TRUE(refused(op::linear_id, {f32({5, 64}), f32({8, 3, 64}), f32({5, 2})}));               // ids not integer
}

// The recurrent mixers: outputs packed per row (every token's, then the row's new state).
TEST(infer, recurrent_ops_pack_outputs_and_states) {
  const auto i32 = [](std::initializer_list<std::int64_t> s) { return t(dtype::i32, s); };
  // ssm_conv: x [R=2, T=3, C=8], state [S=4, (K-1) C = 24], rows [2], pos and write [6], w [8, K=4].
  EXPECT_EQ(ok(op::ssm_conv, {f32({2, 3, 8}), f32({4, 24}), i32({2}), i32({6}), i32({6}), f32({8, 4})}), f32({2, 3 * 8 + 3 * 8}));
  EXPECT_TRUE(refused(op::ssm_conv, {f32({2, 3, 8}), f32({4, 16}), i32({2}), i32({6}), i32({6}), f32({8, 4})}));   // window of K-1 = 3
  EXPECT_TRUE(refused(op::ssm_conv, {f32({2, 3, 8}), f32({4, 24}), i32({3}), i32({6}), i32({6}), f32({8, 4})}));   // a row per row
  EXPECT_TRUE(refused(op::ssm_conv, {f32({2, 3, 8}), f32({4, 24}), i32({2}), i32({5}), i32({6}), f32({8, 4})}));   // pos per token
  EXPECT_TRUE(refused(op::ssm_conv, {f32({2, 3, 8}), f32({4, 24}), i32({2}), i32({6}), i32({6})}));                // 6 inputs
  // ssm_scan: x [R=2, T=3, H=4, P=2], dt [2, 3, 4], A [4], B and C [2, 3, G=2, N=5], state [S=4, H P N = 40].
  EXPECT_EQ(ok(op::ssm_scan, {f32({2, 3, 4, 2}), f32({2, 3, 4}), f32({4}), f32({2, 3, 2, 5}), f32({2, 3, 2, 5}), f32({4, 40}), i32({2}),
                              i32({6}), i32({6})}),
            f32({2, 3 * 4 * 2 + 40}));
  EXPECT_TRUE(refused(op::ssm_scan, {f32({2, 3, 4, 2}), f32({2, 3, 4}), f32({4}), f32({2, 3, 3, 5}), f32({2, 3, 3, 5}), f32({4, 40}),
                                     i32({2}), i32({6}), i32({6})}));  // 3 groups do not divide 4 heads
  EXPECT_TRUE(refused(op::ssm_scan, {f32({2, 3, 4, 2}), f32({2, 3, 4}), f32({4}), f32({2, 3, 2, 5}), f32({2, 3, 2, 5}), f32({4, 41}),
                                     i32({2}), i32({6}), i32({6})}));  // state not H P N
  EXPECT_TRUE(refused(op::ssm_scan, {f32({2, 3, 4, 2}), f32({2, 3, 4}), f32({4}), f32({2, 3, 2, 5}), f32({2, 3, 2, 5}), f32({4, 40}),
                                     f32({2}), i32({6}), i32({6})}));  // rows are indices
  // delta_rule: q and k [R=2, T=3, Hk=2, Dk=4], v [2, 3, H=4, Dv=5], g and beta [2, 3, 4], state [S=3, H Dv Dk = 80].
  EXPECT_EQ(ok(op::delta_rule, {f32({2, 3, 2, 4}), f32({2, 3, 2, 4}), f32({2, 3, 4, 5}), f32({2, 3, 4}), f32({2, 3, 4}), f32({3, 80}),
                                i32({2}), i32({6}), i32({6})}),
            f32({2, 3 * 4 * 5 + 80}));
  EXPECT_TRUE(refused(op::delta_rule, {f32({2, 3, 3, 4}), f32({2, 3, 3, 4}), f32({2, 3, 4, 5}), f32({2, 3, 4}), f32({2, 3, 4}), f32({3, 80}),
                                       i32({2}), i32({6}), i32({6})}));  // 3 key heads do not divide 4 value heads
  EXPECT_TRUE(refused(op::delta_rule, {f32({2, 3, 2, 4}), f32({2, 3, 2, 3}), f32({2, 3, 4, 5}), f32({2, 3, 4}), f32({2, 3, 4}), f32({3, 80}),
                                       i32({2}), i32({6}), i32({6})}));  // k unlike q
  EXPECT_TRUE(refused(op::delta_rule, {f32({2, 3, 2, 4}), f32({2, 3, 2, 4}), f32({2, 3, 4, 5}), f32({2, 3, 4}), f32({2, 3, 4}), f32({3, 60}),
                                       i32({2}), i32({6}), i32({6})}));  // state not H Dv Dk
  EXPECT_TRUE(refused(op::delta_rule, {f32({2, 3, 2, 4}), f32({2, 3, 2, 4}), f32({2, 3, 4, 5}), f32({2, 3, 4}), f32({2, 3}), f32({3, 80}),
                                       i32({2}), i32({6}), i32({6})}));  // beta per head
}

TEST(infer, linear_accepts_packed_weights) {
  EXPECT_EQ(ok(op::linear, {f32({7, 256}), t(dtype::q4_k, {3, 256})}), f32({7, 3}));
  EXPECT_EQ(ok(op::linear, {f32({1, 1}), f32({1, 1})}), f32({1, 1}));
  EXPECT_TRUE(refused(op::linear, {f32({7, 64}), t(dtype::q4_k, {3, 64})}));  // not whole blocks
  EXPECT_TRUE(refused(op::linear, {f32({7, 64}), t(dtype::i32, {3, 64})}));
  EXPECT_EQ(ok(op::gather_rows, {t(dtype::q8_0, {10, 32}), t(dtype::i32, {2, 3})}), f32({2, 3, 32}));
  EXPECT_EQ(ok(op::gather_rows, {t(dtype::bf16, {10, 3}), t(dtype::i64, {1})}), f32({1, 3}));
  EXPECT_EQ(ok(op::gather_rows, {t(dtype::i32, {10, 3}), t(dtype::i64, {1})}), t(dtype::i32, {1, 3}));
  EXPECT_TRUE(refused(op::gather_rows, {f32({10, 3}), f32({1})}));
  EXPECT_EQ(ok(op::scatter_rows, {f32({8, 2, 4}), t(dtype::i32, {3}), f32({3, 2, 4})}), f32({8, 2, 4}));
  EXPECT_TRUE(refused(op::scatter_rows, {f32({8, 2, 4}), t(dtype::i32, {3}), f32({3, 2, 5})}));
  EXPECT_EQ(ok(op::rms_norm, {f32({5, 3}), f32({3})}), f32({5, 3}));
  EXPECT_TRUE(refused(op::rms_norm, {f32({5, 3}), f32({5})}));
  EXPECT_EQ(ok(op::rope, {f32({5, 2, 8}), t(dtype::i32, {5}), f32({3})}), f32({5, 2, 8}));
  EXPECT_TRUE(refused(op::rope, {f32({5, 2, 8}), t(dtype::i32, {5}), f32({5})}));
  const auto ix = t(dtype::i32, {2, 5});
  EXPECT_EQ(ok(op::attention, {f32({6, 4, 8}), f32({10, 2, 8}), f32({10, 2, 6}), ix, t(dtype::boolean, {2, 3, 5})}), f32({6, 4, 6}));
  EXPECT_TRUE(refused(op::attention, {f32({6, 3, 8}), f32({10, 2, 8}), f32({10, 2, 8}), ix, t(dtype::boolean, {2, 3, 5})}));
  EXPECT_TRUE(refused(op::attention, {f32({5, 4, 8}), f32({10, 2, 8}), f32({10, 2, 8}), ix, t(dtype::boolean, {2, 3, 5})}));
  EXPECT_TRUE(refused(op::attention, {f32({6, 4, 8}), f32({10, 2, 8}), f32({10, 2, 8}), f32({2, 5}), t(dtype::boolean, {2, 3, 5})}));
  EXPECT_TRUE(refused(op::add, {f32({1})}));  // arity
}

}  // namespace
}  // namespace troupe::graph

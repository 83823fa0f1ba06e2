#include "engine/eval/oracle.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/core/half.hpp"
#include "engine/graph/builder.hpp"

namespace troupe::eval {
namespace {

using graph::builder;
using graph::op;
using graph::slot_kind;
using graph::tensor_type;
using graph::value_id;

tensor make(dtype t, troupe::shape s, std::vector<double> xs) {
  tensor out(t, s);
  for (std::size_t i = 0; i < xs.size(); ++i) store_element(t, out.data(), static_cast<std::int64_t>(i), xs[i]);
  return out;
}
tensor f32(troupe::shape s, std::vector<double> xs) { return make(dtype::f32, s, std::move(xs)); }
tensor i32(troupe::shape s, std::vector<double> xs) { return make(dtype::i32, s, std::move(xs)); }

std::vector<double> values(const tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) out[i] = load_element(t.type(), t.data(), i);
  return out;
}

void expect_near(const tensor& t, std::vector<double> want, double tol = 1e-6) {
  const auto got = values(t);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// Builds a one-op graph over literal-free slots named a, b, c..., evaluates it and returns "out".
struct one_op {
  std::vector<tensor> inputs;
  tensor run(const std::function<value_id(builder&, std::vector<value_id>&)>& body) {
    builder b;
    std::vector<value_id> ins;
    eval_inputs in;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const std::string name(1, static_cast<char>('a' + i));
      ins.push_back(b.slot(slot_kind::request_input, {inputs[i].type(), inputs[i].shape()}, name));
      in.slots.emplace(name, inputs[i].view());
    }
    b.output("out", body(b, ins));
    auto g = std::move(b).finish();
    EXPECT_TRUE(g) << g.error().message();
    if (!g) return {};
    auto ev = evaluate(*g, in);
    EXPECT_TRUE(ev) << ev.error().message();
    if (!ev) return {};
    return ev->outputs.at("out");
  }
};

TEST(oracle, elementwise_hand_values) {
  one_op t{{f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3}, {10, 20, 30})}};
  expect_near(t.run([](builder& b, auto& v) { return b.add(v[0], v[1]); }), {11, 22, 33, 14, 25, 36});
  expect_near(t.run([](builder& b, auto& v) { return b.binary(op::maximum, v[0], v[1]); }), {10, 20, 30, 10, 20, 30});
  one_op u{{f32({5}, {0, 1, -1, 4, 0.5})}};
  expect_near(u.run([](builder& b, auto& v) { return b.unary(op::silu, v[0]); }), {0, 0.7310585786, -0.2689414214, 3.9280551, 0.3112296656});
  expect_near(u.run([](builder& b, auto& v) { return b.unary(op::gelu_tanh, v[0]); }), {0, 0.8411919906, -0.1588080094, 3.9999297, 0.3457140});
  expect_near(u.run([](builder& b, auto& v) { return b.unary(op::sigmoid, v[0]); }), {0.5, 0.7310585786, 0.2689414214, 0.9820137900, 0.6224593312});
  one_op r{{f32({1}, {4})}};  // shape of size 1
  expect_near(r.run([](builder& b, auto& v) { return b.unary(op::rsqrt, v[0]); }), {0.5});
}

TEST(oracle, integer_arithmetic_and_division_by_zero) {
  one_op t{{i32({3}, {-7, 7, 9}), i32({3}, {2, 2, 0})}};
  builder b;
  const auto x = b.slot(slot_kind::token_ids, {dtype::i32, {3}});
  const auto y = b.slot(slot_kind::positions, {dtype::i32, {3}});
  b.output("out", b.div(x, y));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g);
  eval_inputs in;
  in.slots.emplace("token_ids", t.inputs[0].view());
  in.slots.emplace("positions", t.inputs[1].view());
  auto ev = evaluate(*g, in);
  ASSERT_FALSE(ev);
  EXPECT_EQ(ev.error().code, eval_error_code::division_by_zero);
  one_op ok{{i32({2}, {-7, 7}), i32({2}, {2, 2})}};
  expect_near(ok.run([](builder& b, auto& v) { return b.div(v[0], v[1]); }), {-3, 3});
}

TEST(oracle, compare_where_and_cast) {
  one_op t{{f32({4}, {1, 2, 3, 4}), f32({1}, {2.5})}};
  const auto lt = t.run([](builder& b, auto& v) { return b.binary(op::less, v[0], v[1]); });
  EXPECT_EQ(lt.type(), dtype::boolean);
  expect_near(lt, {1, 1, 0, 0});
  expect_near(t.run([](builder& b, auto& v) { return b.where(b.binary(op::greater, v[0], v[1]), v[0], v[1]); }), {2.5, 2.5, 3, 4});
  one_op c{{f32({5}, {2.5, 3.5, -2.5, 1e10, 0.6})}};
  expect_near(c.run([](builder& b, auto& v) { return b.cast(v[0], dtype::i32); }), {2, 4, -2, 2147483647, 1});  // half to even, saturating
  const auto h = c.run([](builder& b, auto& v) { return b.cast(v[0], dtype::f16); });
  EXPECT_EQ(h.as<std::uint16_t>()[4], f32_to_f16(0.6f));
}

TEST(oracle, reductions_softmax_and_argmax) {
  one_op t{{f32({2, 3}, {1, 5, 3, 4, 2, 6})}};
  expect_near(t.run([](builder& b, auto& v) { return b.reduce(op::reduce_sum, v[0], 0); }), {5, 7, 9});
  expect_near(t.run([](builder& b, auto& v) { return b.reduce(op::reduce_max, v[0], 1); }), {5, 6});
  expect_near(t.run([](builder& b, auto& v) { return b.reduce(op::reduce_mean, v[0], -1, true); }), {3, 4});
  one_op ties{{f32({1, 4}, {1, 7, 7, 2})}};
  expect_near(ties.run([](builder& b, auto& v) { return b.arg_max(v[0]); }), {1});  // first of a tie
  one_op s{{f32({3}, {1, 2, 3})}};
  expect_near(s.run([](builder& b, auto& v) { return b.softmax(v[0]); }), {0.0900305732, 0.2447284711, 0.6652409558});
  expect_near(s.run([](builder& b, auto& v) { return b.log_softmax(v[0]); }), {-2.4076059644, -1.4076059644, -0.4076059644});
  one_op big{{f32({2}, {1000, 1000})}};  // no overflow: the max is subtracted first
  expect_near(big.run([](builder& b, auto& v) { return b.softmax(v[0]); }), {0.5, 0.5});
}

TEST(oracle, movement) {
  one_op t{{f32({2, 3}, {1, 2, 3, 4, 5, 6})}};
  expect_near(t.run([](builder& b, auto& v) { return b.transpose(v[0], {1, 0}); }), {1, 4, 2, 5, 3, 6});
  expect_near(t.run([](builder& b, auto& v) { return b.reshape(v[0], {3, 2}); }), {1, 2, 3, 4, 5, 6});
  expect_near(t.run([](builder& b, auto& v) { return b.slice(v[0], 1, 1, 3); }), {2, 3, 5, 6});
  expect_near(t.run([](builder& b, auto& v) { return b.concat({v[0], v[0]}, 1); }), {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6});
  one_op r{{f32({1, 3}, {7, 8, 9})}};
  expect_near(r.run([](builder& b, auto& v) { return b.broadcast(v[0], {2, 3}); }), {7, 8, 9, 7, 8, 9});
  one_op p{{f32({2, 3, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})}};
  expect_near(p.run([](builder& b, auto& v) { return b.transpose(v[0], {2, 0, 1}); }), {0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11});
}

TEST(oracle, matmul_and_linear) {
  one_op m{{f32({1, 2, 3}, {1, 2, 3, 4, 5, 6}), f32({1, 3, 1}, {1, 0, -1})}};
  expect_near(m.run([](builder& b, auto& v) { return b.matmul(v[0], v[1]); }), {-2, -2});
  one_op l{{f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({2, 3}, {1, 1, 1, 0, 1, 0})}};
  expect_near(l.run([](builder& b, auto& v) { return b.linear(v[0], v[1]); }), {6, 2, 15, 5});
  one_op h{{f32({1, 3}, {1, 2, 3}), make(dtype::f16, {1, 3}, {0.5, 0.25, 0.125})}};
  expect_near(h.run([](builder& b, auto& v) { return b.linear(v[0], v[1]); }), {1.375});
}

TEST(oracle, linear_over_q8_0_weights) {
  // One q8_0 row of 32: d = 0.5 (f16 0x3800), q[i] = i - 16, so w[i] = (i - 16) / 2.
  tensor w(dtype::q8_0, {1, 32});
  const std::uint16_t d = 0x3800;
  std::memcpy(w.data(), &d, 2);
  for (int i = 0; i < 32; ++i) w.data()[2 + i] = static_cast<std::byte>(static_cast<std::int8_t>(i - 16));
  // x = 1 everywhere: sum over i of (i - 16) / 2 = (496 - 512) / 2 = -8.
  tensor x = f32({1, 32}, std::vector<double>(32, 1.0));
  builder b;
  const auto xv = b.slot(slot_kind::request_input, {dtype::f32, {1, 32}}, "x");
  const auto wv = b.weight({troupe::graph::tensor_role::ffn_up, 0}, {dtype::q8_0, {1, 32}});
  b.output("y", b.linear(xv, wv));
  b.output("row", b.gather_rows(wv, b.slot(slot_kind::token_ids, {dtype::i32, {1}})));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g) << g.error().message();
  map_const_source weights;
  weights.add({troupe::graph::tensor_role::ffn_up, 0}, w);
  eval_inputs in;
  in.weights = &weights;
  tensor ids = i32({1}, {0});
  in.slots.emplace("x", x.view());
  in.slots.emplace("token_ids", ids.view());
  auto ev = evaluate(*g, in);
  ASSERT_TRUE(ev) << ev.error().message();
  expect_near(ev->outputs.at("y"), {-8});
  EXPECT_FLOAT_EQ(ev->outputs.at("row").as<float>()[0], -8.0f);
  EXPECT_FLOAT_EQ(ev->outputs.at("row").as<float>()[31], 7.5f);
}

TEST(oracle, gather_and_scatter_rows_check_indices) {
  one_op g{{f32({3, 2}, {1, 2, 3, 4, 5, 6}), i32({2, 2}, {2, 0, 1, 1})}};
  expect_near(g.run([](builder& b, auto& v) { return b.gather_rows(v[0], v[1]); }), {5, 6, 1, 2, 3, 4, 3, 4});
  one_op s{{f32({4, 2}, {0, 0, 0, 0, 0, 0, 0, 0}), i32({3}, {3, -1, 0}), f32({3, 2}, {1, 2, 3, 4, 5, 6})}};
  expect_near(s.run([](builder& b, auto& v) { return b.scatter_rows(v[0], v[1], v[2]); }), {5, 6, 0, 0, 0, 0, 1, 2});

  auto run_error = [](tensor table, tensor ids, bool scatter) {
    builder b;
    const auto t = b.slot(slot_kind::request_input, {table.type(), table.shape()}, "t");
    const auto i = b.slot(slot_kind::kv_write_map, {ids.type(), ids.shape()});
    if (scatter) {
      const auto src = b.slot(slot_kind::request_input, {table.type(), troupe::shape{ids.shape()[0], table.shape()[1]}}, "src");
      b.output("o", b.scatter_rows(t, i, src));
    } else {
      b.output("o", b.gather_rows(t, i));
    }
    auto g = std::move(b).finish();
    tensor src(table.type(), {ids.shape()[0], table.shape()[1]});
    eval_inputs in;
    in.slots.emplace("t", table.view());
    in.slots.emplace("kv_write_map", ids.view());
    in.slots.emplace("src", src.view());
    auto ev = evaluate(*g, in);
    EXPECT_FALSE(ev);
    return ev ? eval_error_code::missing_slot : ev.error().code;
  };
  EXPECT_EQ(run_error(f32({3, 2}, {}), i32({1}, {3}), false), eval_error_code::index_out_of_range);
  EXPECT_EQ(run_error(f32({3, 2}, {}), i32({1}, {-1}), false), eval_error_code::index_out_of_range);
  EXPECT_EQ(run_error(f32({3, 2}, {}), i32({1}, {5}), true), eval_error_code::index_out_of_range);
  EXPECT_EQ(run_error(f32({3, 2}, {}), i32({2}, {1, 1}), true), eval_error_code::duplicate_index);
}

TEST(oracle, norms) {
  one_op r{{f32({1, 3}, {1, 2, 3}), f32({3}, {1, 1, 2})}};
  // mean(x^2) = 14/3, 1/sqrt(14/3) = 0.4629100499
  expect_near(r.run([](builder& b, auto& v) { return b.rms_norm(v[0], v[1], 0.0); }), {0.4629100499, 0.9258200998, 2.7774602993});
  one_op l{{f32({2, 3}, {1, 2, 3, 5, 5, 5}), f32({3}, {1, 1, 1}), f32({3}, {0, 0, 1})}};
  // row 1: mean 2, var 2/3; row 2: var 0 with eps 1e-5 -> zeros (plus bias)
  expect_near(l.run([](builder& b, auto& v) { return b.layer_norm(v[0], v[1], v[2], 1e-5); }),
              {-1.2247356, 0, 2.2247356, 0, 0, 1}, 2e-6);
}

TEST(oracle, rope_neox_interleaved_and_partial) {
  // x = [1, 0, 0, 1] at position 1, inv_freq = [1, 0.5].
  one_op t{{f32({1, 1, 4}, {1, 0, 0, 1}), i32({1}, {1}), f32({2}, {1, 0.5})}};
  // neox pairs (0, 2) at angle 1 and (1, 3) at angle 0.5
  expect_near(t.run([](builder& b, auto& v) { return b.rope(v[0], v[1], v[2], true); }),
              {0.5403023059, -0.4794255386, 0.8414709848, 0.8775825619});
  // interleaved pairs (0, 1) at angle 1 and (2, 3) at angle 0.5
  expect_near(t.run([](builder& b, auto& v) { return b.rope(v[0], v[1], v[2], false); }),
              {0.5403023059, 0.8414709848, -0.4794255386, 0.8775825619});
  expect_near(t.run([](builder& b, auto& v) { return b.rope(v[0], v[1], v[2], false, 2.0); }),
              {1.0806046118, 1.6829419696, -0.9588510772, 1.7551651238});
  // partial rotary: D = 3 with R = 2 leaves the last dim alone; position 0 is the identity
  one_op p{{f32({2, 1, 3}, {1, 0, 7, 1, 0, 7}), i32({2}, {0, 1}), f32({1}, {1})}};
  expect_near(p.run([](builder& b, auto& v) { return b.rope(v[0], v[1], v[2], true); }), {1, 0, 7, 0.5403023059, 0.8414709848, 7});
}

TEST(oracle, attention_gqa_mask_and_softcap) {
  // Hq = 2 query heads share Hkv = 1; q = 1 and 2, keys 0 and 1, values 10 and 20, read in order.
  auto inputs = [](std::vector<double> allow, std::vector<double> index = {0, 1}) {
    return std::vector<tensor>{f32({1, 2, 1}, {1, 2}), f32({2, 1, 1}, {0, 1}), f32({2, 1, 1}, {10, 20}),
                               i32({1, 2}, std::move(index)), make(dtype::boolean, {1, 1, 2}, std::move(allow))};
  };
  auto attend = [](double softcap) {
    return [softcap](builder& b, std::vector<value_id>& v) { return b.attention(v[0], v[1], v[2], v[3], v[4], 1.0, softcap); };
  };
  one_op all{inputs({1, 1})};
  // head 0: softmax([0, 1]) = [0.2689414, 0.7310586] -> 17.310586; head 1: softmax([0, 2]) -> 18.807971
  expect_near(all.run(attend(0)), {17.3105857863, 18.8079707798});
  // softcap 1: head 1 scores [0, tanh 2 = 0.9640276] -> 10 + 10 * sigmoid(0.9640276)
  expect_near(all.run(attend(1)), {10 + 10 / (1 + std::exp(-std::tanh(1.0))), 10 + 10 / (1 + std::exp(-std::tanh(2.0)))});
  one_op first{inputs({1, 0})};
  expect_near(first.run(attend(0)), {10, 10});
  one_op none{inputs({0, 0})};
  expect_near(none.run(attend(0)), {0, 0});
  // The index decides which rows are read: reversed, key 0 is row 1 (score 1, value 20).
  one_op reversed{inputs({1, 0}, {1, 0})};
  expect_near(reversed.run(attend(0)), {20, 20});
  // An index outside the rows is never read where the mask excludes it...
  one_op masked{inputs({1, 0}, {0, 99})};
  expect_near(masked.run(attend(0)), {10, 10});
}

TEST(oracle, attention_values_may_be_a_prefix_of_each_row) {
  // q = (1, 0); key rows (0, 5) and (1, 7): scores 0 and 1. With ints {1} the values are each row's
  // first dim, 0 and 1: the output is softmax([0, 1])[1] = 0.7310586 and has one dim.
  one_op t{{f32({1, 1, 2}, {1, 0}), f32({2, 1, 2}, {0, 5, 1, 7}), i32({1, 2}, {0, 1}), make(dtype::boolean, {1, 1, 2}, {1, 1})}};
  expect_near(t.run([](builder& b, std::vector<value_id>& v) { return b.attention(v[0], v[1], v[1], v[2], v[3], 1.0, 0.0, {}, 1); }),
              {0.7310585786});
  // A width past the row is refused when the graph is built.
  builder b;
  const auto q = b.slot(slot_kind::request_input, {dtype::f32, {1, 1, 2}}, "q");
  const auto k = b.slot(slot_kind::request_input, {dtype::f32, {2, 1, 2}}, "k");
  const auto ix = b.slot(slot_kind::kv_read_map, {dtype::i32, {1, 2}});
  const auto allow = b.slot(slot_kind::token_mask, {dtype::boolean, {1, 1, 2}});
  b.output("o", b.attention(q, k, k, ix, allow, 1.0, 0.0, {}, 3));
  EXPECT_FALSE(std::move(b).finish());
}

TEST(oracle, attention_refuses_an_allowed_index_outside_the_rows) {
  builder b;
  const auto q = b.slot(slot_kind::request_input, {dtype::f32, {1, 1, 1}}, "q");
  const auto k = b.slot(slot_kind::request_input, {dtype::f32, {2, 1, 1}}, "k");
  const auto ix = b.slot(slot_kind::kv_read_map, {dtype::i32, {1, 2}});
  const auto allow = b.slot(slot_kind::token_mask, {dtype::boolean, {1, 1, 2}});
  b.output("o", b.attention(q, k, k, ix, allow, 1.0));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g) << g.error().message();
  tensor qv = f32({1, 1, 1}, {1}), kv = f32({2, 1, 1}, {1, 2}), iv = i32({1, 2}, {0, 2}), av = make(dtype::boolean, {1, 1, 2}, {1, 1});
  eval_inputs in;
  in.slots = {{"q", qv.view()}, {"k", kv.view()}, {"kv_read_map", iv.view()}, {"token_mask", av.view()}};
  auto ev = evaluate(*g, in);
  ASSERT_FALSE(ev);
  EXPECT_EQ(ev.error().code, eval_error_code::index_out_of_range);
}

TEST(oracle, binds_states_and_refuses_bad_inputs) {
  builder b;
  const auto cache = b.state_input("kv", {dtype::f32, {3, 2}});
  const auto ids = b.slot(slot_kind::kv_write_map, {dtype::i32, {1}});
  const auto row = b.slot(slot_kind::request_input, {dtype::f32, {1, 2}}, "row");
  const auto w = b.weight({troupe::graph::tensor_role::ffn_norm}, {dtype::f32, {2}});
  const auto next = b.scatter_rows(cache, ids, row);
  b.state_output("kv", next);
  b.output("sum", b.reduce(op::reduce_sum, b.mul(next, w), 0));
  auto g = std::move(b).finish();
  ASSERT_TRUE(g) << g.error().message();

  tensor kv = f32({3, 2}, {1, 1, 1, 1, 1, 1}), id = i32({1}, {1}), r = f32({1, 2}, {5, 7});
  map_const_source weights;
  weights.add({troupe::graph::tensor_role::ffn_norm}, f32({2}, {1, 10}));
  eval_inputs in;
  in.weights = &weights;
  in.states.emplace("kv", kv.view());
  in.slots.emplace("kv_write_map", id.view());
  in.slots.emplace("row", r.view());
  eval_options opt;
  opt.keep_values = true;
  auto ev = evaluate(*g, in, opt);
  ASSERT_TRUE(ev) << ev.error().message();
  expect_near(ev->states.at("kv"), {1, 1, 5, 7, 1, 1});
  expect_near(ev->outputs.at("sum"), {7, 90});
  EXPECT_EQ(ev->values.size(), g->values().size());

  auto missing = in;
  missing.slots.erase("row");
  auto e1 = evaluate(*g, missing);
  ASSERT_FALSE(e1);
  EXPECT_EQ(e1.error().code, eval_error_code::missing_slot);
  EXPECT_EQ(e1.error().where, "slot row");
  auto wrong = in;
  tensor r3 = f32({1, 3}, {1, 2, 3});
  wrong.slots.at("row") = r3.view();
  EXPECT_EQ(evaluate(*g, wrong).error().code, eval_error_code::type_mismatch);
  auto no_state = in;
  no_state.states.clear();
  EXPECT_EQ(evaluate(*g, no_state).error().code, eval_error_code::missing_state);
  auto no_weight = in;
  no_weight.weights = nullptr;
  EXPECT_EQ(evaluate(*g, no_weight).error().code, eval_error_code::missing_weight);
}

}  // namespace
}  // namespace troupe::eval

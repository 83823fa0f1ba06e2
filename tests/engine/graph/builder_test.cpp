#include "engine/graph/builder.hpp"

#include <gtest/gtest.h>

namespace troupe::graph {

struct graph_test_access {
  static std::vector<equation>& eqns(graph& g) { return g.eqns_; }
  static std::vector<value_info>& values(graph& g) { return g.values_; }
  static std::vector<state_pair>& states(graph& g) { return g.states_; }
};

namespace {

tensor_type f32(std::initializer_list<std::int64_t> d) { return {dtype::f32, troupe::shape(d)}; }
tensor_type i32(std::initializer_list<std::int64_t> d) { return {dtype::i32, troupe::shape(d)}; }

// A tiny decoder-like step: embed, norm, project, one state, logits.
result<graph, trace_error> tiny_step(trace_limits limits = {}) {
  builder b(limits);
  b.admit_tokens(3);
  const auto ids = b.slot(slot_kind::token_ids, i32({3}));
  const auto emb = b.weight({troupe::graph::tensor_role::token_embd}, {dtype::q8_0, troupe::shape{16, 32}});
  const auto norm_w = b.weight({troupe::graph::tensor_role::attn_norm, 0}, f32({32}));
  const auto cache = b.state_input("kv.k.0", f32({8, 32}));
  const auto pos = b.slot(slot_kind::kv_write_map, i32({3}));
  b.push_scope("layers.0");
  const auto x = b.gather_rows(emb, ids);
  const auto h = b.rms_norm(x, norm_w, 1e-6);
  b.label(h, "attn_norm");
  b.pop_scope();
  b.state_output("kv.k.0", b.scatter_rows(cache, pos, h));
  b.output("logits", b.linear(h, emb));
  return std::move(b).finish();
}

TEST(builder, traces_and_verifies_a_step) {
  auto g = tiny_step();
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_EQ(g->equations().size(), 4u);
  EXPECT_EQ(g->slots().size(), 2u);
  EXPECT_EQ(g->weights().size(), 2u);
  ASSERT_EQ(g->states().size(), 1u);
  EXPECT_TRUE(verify(*g));
  const auto d = g->dump();
  EXPECT_NE(d.find("= weight @token_embd : q8_0[16, 32]"), std::string::npos) << d;
  EXPECT_NE(d.find("rms_norm(%5, %2) {eps=1e-06} : f32[3, 32]  # layers.0.attn_norm"), std::string::npos) << d;
  EXPECT_NE(d.find("state \"kv.k.0\" <- %"), std::string::npos) << d;
  EXPECT_NE(d.find("output \"logits\""), std::string::npos) << d;
}

TEST(builder, same_weight_role_is_one_const) {
  builder b;
  const auto w1 = b.weight({troupe::graph::tensor_role::ffn_up, 2}, f32({4, 4}));
  const auto w2 = b.weight({troupe::graph::tensor_role::ffn_up, 2}, f32({4, 4}));
  EXPECT_EQ(w1, w2);
  b.weight({troupe::graph::tensor_role::ffn_up, 2}, f32({4, 5}));
  EXPECT_FALSE(b.ok());
  EXPECT_TRUE(std::holds_alternative<bad_declaration>(b.error()->kind));
}

TEST(builder, ill_typed_op_is_a_typed_refusal) {
  builder b;
  const auto x = b.slot(slot_kind::positions, f32({3, 4}));
  const auto w = b.slot(slot_kind::request_input, f32({5, 5}), "w");
  const auto y = b.linear(x, w);
  EXPECT_FALSE(y.valid());
  b.output("y", b.add(x, x));  // ignored after the first error
  auto g = std::move(b).finish();
  ASSERT_FALSE(g);
  const auto* e = std::get_if<ill_typed>(&g.error().kind);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->op, "linear");
  EXPECT_NE(e->reason.find("K = 4"), std::string::npos) << e->reason;
}

struct budget_case { budget_resource resource; trace_limits limits; };

class budget_test : public ::testing::TestWithParam<budget_case> {};

TEST_P(budget_test, refuses_before_the_append_and_publishes_nothing) {
  const auto& c = GetParam();
  auto g = tiny_step(c.limits);
  ASSERT_FALSE(g);
  const auto* b = std::get_if<budget_exceeded>(&g.error().kind);
  ASSERT_NE(b, nullptr) << g.error().message();
  EXPECT_EQ(b->resource, c.resource);
  EXPECT_GT(b->attempted, b->limit);
  EXPECT_NE(g.error().message().find(std::string(resource_name(c.resource))), std::string::npos);
}

trace_limits with(budget_resource r, std::int64_t v) {
  trace_limits l;
  switch (r) {
    case budget_resource::tokens: l.tokens = v; break;
    case budget_resource::values: l.values = v; break;
    case budget_resource::equations: l.equations = v; break;
    case budget_resource::literal_bytes: l.literal_bytes = v; break;
    case budget_resource::owned_bytes: l.owned_bytes = v; break;
  }
  return l;
}

INSTANTIATE_TEST_SUITE_P(each_resource, budget_test,
                         ::testing::Values(budget_case{budget_resource::tokens, with(budget_resource::tokens, 2)},
                                           budget_case{budget_resource::values, with(budget_resource::values, 6)},
                                           budget_case{budget_resource::equations, with(budget_resource::equations, 3)},
                                           budget_case{budget_resource::owned_bytes, with(budget_resource::owned_bytes, 600)}));

TEST(builder, literal_budget_is_checked_before_the_copy_is_kept) {
  trace_limits l;
  l.literal_bytes = 100;
  builder b(l);
  b.literal(tensor(dtype::f32, {20}));  // 80 bytes: admitted
  EXPECT_TRUE(b.ok());
  const auto before = b.owned_bytes();
  b.literal(tensor(dtype::f32, {20}));  // 160 in all: refused
  ASSERT_FALSE(b.ok());
  const auto& e = std::get<budget_exceeded>(b.error()->kind);
  EXPECT_EQ(e.resource, budget_resource::literal_bytes);
  EXPECT_EQ(e.limit, 100);
  EXPECT_EQ(e.attempted, 160);
  EXPECT_EQ(b.owned_bytes(), before);
}

TEST(builder, owned_bytes_never_pass_the_limit) {
  trace_limits l;
  l.owned_bytes = 2000;
  builder b(l);
  auto x = b.slot(slot_kind::token_ids, f32({4}));
  for (int i = 0; i < 1000 && b.ok(); ++i) x = b.unary(op::exp, x);
  EXPECT_FALSE(b.ok());
  EXPECT_LE(b.owned_bytes(), 2000);
}

TEST(builder, states_must_be_carried_exactly) {
  {
    builder b;
    const auto s = b.state_input("kv", f32({2}));
    b.output("o", s);
    auto g = std::move(b).finish();
    ASSERT_FALSE(g);
    EXPECT_TRUE(std::holds_alternative<state_mismatch>(g.error().kind));
  }
  {
    builder b;
    const auto x = b.slot(slot_kind::token_ids, f32({2}));
    b.state_output("kv", x);
    EXPECT_TRUE(std::holds_alternative<state_mismatch>(b.error()->kind));
  }
  {
    builder b;
    b.state_input("kv", f32({2}));
    const auto x = b.slot(slot_kind::token_ids, f32({3}));
    b.state_output("kv", x);
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.error()->message().find("carried as f32[3]"), std::string::npos);
  }
}

TEST(builder, slots_are_declared_once_and_request_inputs_named) {
  builder b;
  b.slot(slot_kind::positions, i32({3}));
  b.slot(slot_kind::positions, i32({3}));
  EXPECT_TRUE(std::holds_alternative<bad_declaration>(b.error()->kind));
  builder c;
  c.slot(slot_kind::request_input, f32({3}));
  EXPECT_FALSE(c.ok());
}

TEST(builder, a_graph_needs_an_output) {
  builder b;
  b.slot(slot_kind::token_ids, i32({1}));
  auto g = std::move(b).finish();
  ASSERT_FALSE(g);
  EXPECT_TRUE(std::holds_alternative<bad_declaration>(g.error().kind));
}

TEST(verify, catches_a_corrupted_graph) {
  auto g = tiny_step();
  ASSERT_TRUE(g);
  {
    graph h = *g;
    graph_test_access::values(h)[graph_test_access::eqns(h)[1].out.index].type = f32({3, 31});
    auto r = verify(h);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().reason.find("infers f32[3, 32]"), std::string::npos) << r.error().message();
  }
  {
    graph h = *g;
    std::swap(graph_test_access::eqns(h)[0], graph_test_access::eqns(h)[1]);
    auto r = verify(h);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().reason.find("used before it is defined"), std::string::npos);
  }
  {
    graph h = *g;
    graph_test_access::states(h)[0].out = value_id{};
    EXPECT_FALSE(verify(h));
  }
}

}  // namespace
}  // namespace troupe::graph

// The registry and the typed refusals of the model contract.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "apps/oracle_runner.hpp"
#include "engine/load/gguf.hpp"
#include "families/families.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"

namespace troupe::families {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const auto p = fs::temp_directory_path() / ("troupe-registry-test-" + std::to_string(::getpid())) / name;
  fs::create_directories(p.parent_path());
  return p;
}

TEST(registry, every_shipped_key_resolves_to_exactly_one_family) {
  const auto reg = registry::builtin();
  EXPECT_EQ(reg.entries().size(), 29u);
  for (const auto& e : reg.entries()) {
    for (const auto& k : e.keys) {
      auto cfg = k.source == load::config_source::gguf
                     ? std::optional<load::raw_config>()
                     : std::optional<load::raw_config>(*load::raw_config::from_json_string("{\"model_type\": \"" + std::string(k.key) + "\"}"));
      if (!cfg) continue;
      auto f = reg.resolve(*cfg);
      ASSERT_TRUE(f);
      EXPECT_EQ((*f)->family, e.family);
    }
  }
}

TEST(registry, gguf_llama_with_experts_is_mixtral_and_without_is_llama) {
  const auto reg = registry::builtin();
  fixture_dims d;
  d.hidden = 64;
  d.ffn = 96;
  d.heads = 2;
  d.kv_heads = 1;
  d.head_dim = 32;
  d.experts = 4;
  const auto moe = scratch("mixtral.gguf"), dense = scratch("llama.gguf");
  ASSERT_TRUE(write_fixture("mixtral", d, moe, true));
  ASSERT_TRUE(write_fixture("llama", d, dense, true));
  auto a = load::raw_config::open(moe);
  auto b = load::raw_config::open(dense);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(*a->get_string("general.architecture"), "llama");
  auto fa = reg.resolve(*a);
  auto fb = reg.resolve(*b);
  ASSERT_TRUE(fa && fb);
  EXPECT_EQ((*fa)->family, "mixtral");
  EXPECT_EQ((*fb)->family, "llama");
}

TEST(registry, a_duplicate_key_is_refused) {
  const family_entry twice[] = {llama_entry, llama_entry};
  auto r = registry::from(twice);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().key, "llama");
}

TEST(registry, unknown_family_is_unregistered_before_any_tensor_is_read) {
  // An HF directory whose weights are garbage: resolution must refuse on model_type alone.
  const auto dir = scratch("unknown-hf");
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "mamba9", "hidden_size": 8})";
  std::ofstream(dir / "model.safetensors") << "this is not a safetensors file";
  auto h = model_handle::load(dir, registry::builtin());
  ASSERT_FALSE(h);
  const auto* u = std::get_if<unregistered>(&h.error());
  ASSERT_NE(u, nullptr) << message(h.error());
  EXPECT_EQ(u->key, "mamba9");
  EXPECT_NE(u->message().find("unsupported model"), std::string::npos);

  // A GGUF of an unknown architecture: refused with the same error.
  load::gguf_writer w;
  w.add("general.architecture", "mamba9");
  tensor t(dtype::f32, {4});
  w.add_tensor("x.weight", t.view());
  const auto gguf = scratch("unknown.gguf");
  ASSERT_TRUE(w.write(gguf));
  auto g = model_handle::load(gguf, registry::builtin());
  ASSERT_FALSE(g);
  EXPECT_TRUE(std::holds_alternative<unregistered>(g.error()));
}

class refusals : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_dims d;
    d.vocab = 300;
    d.hidden = 64;
    d.ffn = 96;
    d.head_dim = 16;
    const auto dir = scratch("llama-hf");
    ASSERT_TRUE(write_fixture("llama", d, dir, false));
    auto h = model_handle::load(dir, registry::builtin());
    ASSERT_TRUE(h) << message(h.error());
    handle_ = *h;
  }
  std::shared_ptr<const model_handle> handle_;
};

TEST_F(refusals, untraceable_shapes) {
  step_spec s;
  s.shape = step_shape(1, 8, 4);  // more new tokens than capacity
  auto g = handle_->model().trace(s);
  ASSERT_FALSE(g);
  EXPECT_TRUE(std::holds_alternative<graph::unsupported_shape>(g.error().kind)) << g.error().message();
  s.shape = step_shape(1, 1, 10).with_kv(kv_layout::paged(4, 8));  // capacity not whole blocks
  EXPECT_TRUE(std::holds_alternative<graph::unsupported_shape>(handle_->model().trace(s).error().kind));
  s.shape = step_shape(0, 1, 10);
  EXPECT_FALSE(handle_->model().trace(s));
}

TEST_F(refusals, budgets_refuse_and_publish_nothing) {
  step_spec s;
  s.shape = step_shape(2, 8, 16);
  graph::trace_limits l;
  l.tokens = 15;  // 16 tokens asked: refused before the tracer runs
  auto g = handle_->model().trace(s, l);
  ASSERT_FALSE(g);
  auto b = std::get<graph::budget_exceeded>(g.error().kind);
  EXPECT_EQ(b.resource, graph::budget_resource::tokens);
  EXPECT_EQ(b.attempted, 16);
  graph::trace_limits e;
  e.equations = 40;
  auto h = handle_->model().trace(s, e);
  ASSERT_FALSE(h);
  EXPECT_EQ(std::get<graph::budget_exceeded>(h.error().kind).resource, graph::budget_resource::equations);
  graph::trace_limits lit;
  lit.literal_bytes = 8;
  EXPECT_EQ(std::get<graph::budget_exceeded>(handle_->model().trace(s, lit).error().kind).resource,
            graph::budget_resource::literal_bytes);
}

TEST_F(refusals, carried_inputs_must_be_declared) {
  step_spec s;
  s.shape = step_shape(1, 1, 4);
  s.carried_inputs = {"image_embeddings"};
  auto g = handle_->model().trace(s);
  ASSERT_FALSE(g);
  EXPECT_TRUE(std::holds_alternative<graph::bad_declaration>(g.error().kind));
}

// A family that offers only `step` and carries a state its schema does not declare.
class partial_model final : public model {
 public:
  explicit partial_model(const model& base, bool honest) : base_(base), honest_(honest) {
    schema_.add_program(program::step, honest ? std::vector<state_decl>{{"s", dtype::f32, {2}}} : std::vector<state_decl>{});
  }
  const model_config& config() const override { return base_.config(); }
  const model_schema& schema() const override { return schema_; }
  const families::weight_map& weights() const override { return base_.weights(); }

 protected:
  void trace_into(const step_spec& spec, graph::builder& b) const override {
    const auto s = b.state_input("s", {dtype::f32, {spec.shape.kv_slots(), 2}});
    b.state_output("s", s);
    b.output("logits", s);
  }

 private:
  const model& base_;
  bool honest_;
  model_schema schema_;
};

TEST_F(refusals, missing_program_and_undeclared_state) {
  partial_model honest(handle_->model(), true), liar(handle_->model(), false);
  step_spec enc;
  enc.program = program::encode;
  enc.shape = step_shape(1, 4, 4);
  auto g = honest.trace(enc);
  ASSERT_FALSE(g);
  EXPECT_EQ(std::get<graph::missing_program>(g.error().kind).program, "encode");
  step_spec st;
  st.shape = step_shape(1, 1, 4);
  EXPECT_TRUE(honest.trace(st));
  auto l = liar.trace(st);
  ASSERT_FALSE(l);
  EXPECT_TRUE(std::holds_alternative<graph::state_mismatch>(l.error().kind));
}

TEST(model_schema, bad_request_input_declarations) {
  model_schema s;
  EXPECT_TRUE(s.declare({"segment_ids", dtype::i32, input_extent::per_position, {1}, 0, input_presence::defaulted, 0}));
  EXPECT_FALSE(s.declare({"segment_ids", dtype::i32, input_extent::per_position, {1}}));      // twice
  EXPECT_FALSE(s.declare({"", dtype::f32, input_extent::per_row, {4}}));                      // unnamed
  EXPECT_FALSE(s.declare({"pixels", dtype::q4_0, input_extent::per_row, {32}}));              // block dtype
  EXPECT_FALSE(s.declare({"rows", dtype::f32, input_extent::per_position, {0}}));             // empty width
  EXPECT_FALSE(s.declare({"mask", dtype::f32, input_extent::per_position, {1}, 0, input_presence::required, 1}));  // fill
  EXPECT_EQ(s.request_inputs().size(), 1u);
}

// The paged layout is the same computation over another address map: two sequences sharing one step
// and a shuffled pool give each sequence's contiguous logits.
TEST_F(refusals, paged_batch_equals_contiguous_sequences) {
  const std::int64_t block = 4, blocks = 8, cap = 8, T = 6;
  step_spec s;
  s.shape = step_shape(2, T, cap).with_kv(kv_layout::paged(block, blocks)).with_logits(logit_rows::all);
  auto g = handle_->model().trace(s);
  ASSERT_TRUE(g) << g.error().message();
  const std::int32_t table[2][2] = {{5, 2}, {7, 0}};  // each row's blocks in the pool
  std::vector<std::int32_t> a = {11, 42, 7, 99, 3, 250}, bq = {8, 8, 120, 77, 5, 1};
  tensor ids(dtype::i32, {2 * T}), pos(dtype::i32, {2 * T}), write(dtype::i32, {2 * T}), read(dtype::i32, {2, cap});
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < T; ++t) {
      ids.as<std::int32_t>()[r * T + t] = (r ? bq : a)[t];
      pos.as<std::int32_t>()[r * T + t] = t;
      write.as<std::int32_t>()[r * T + t] = table[r][t / block] * block + t % block;
    }
    for (int j = 0; j < cap; ++j) read.as<std::int32_t>()[r * cap + j] = j < T ? table[r][j / block] * block + j % block : -1;
  }
  app::weight_map_source w(handle_->model().weights());
  eval::eval_inputs in;
  in.weights = &w;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", write.view()}, {"kv_read_map", read.view()}};
  std::vector<tensor> states;
  for (const auto& st : g->states()) states.emplace_back(g->info(st.in).type.type, g->info(st.in).type.dims);
  for (std::size_t i = 0; i < states.size(); ++i) in.states.emplace(g->states()[i].name, states[i].view());
  auto ev = eval::evaluate(*g, in);
  ASSERT_TRUE(ev) << ev.error().message();
  const auto& logits = ev->outputs.at("logits");
  const auto V = handle_->model().config().vocab;
  for (int r = 0; r < 2; ++r) {
    app::oracle_runner run(handle_, cap);
    auto want = run.feed(r ? bq : a, true);
    ASSERT_TRUE(want);
    for (std::int64_t i = 0; i < T * V; ++i) ASSERT_NEAR(logits.as<float>()[r * T * V + i], (*want)[i], 1e-5) << "row " << r;
  }
}

TEST_F(refusals, encode_hidden_equals_the_step_programs_hidden_carry) {
  const std::int64_t T = 5;
  step_spec enc;
  enc.program = program::encode;
  enc.shape = step_shape(1, T, T);
  step_spec st;
  st.shape = step_shape(1, T, T).with_hidden_carry(true);
  auto ge = handle_->model().trace(enc);
  auto gs = handle_->model().trace(st);
  ASSERT_TRUE(ge && gs);
  tensor ids(dtype::i32, {T}), pos(dtype::i32, {T}), mask(dtype::i32, {T}), read(dtype::i32, {1, T});
  for (int t = 0; t < T; ++t) {
    ids.as<std::int32_t>()[t] = 10 + 3 * t;
    pos.as<std::int32_t>()[t] = t;
    mask.as<std::int32_t>()[t] = 1;
    read.as<std::int32_t>()[t] = t;
  }
  app::weight_map_source w(handle_->model().weights());
  eval::eval_inputs ie;
  ie.weights = &w;
  ie.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"token_mask", mask.view()}};
  auto he = eval::evaluate(*ge, ie);
  ASSERT_TRUE(he) << he.error().message();
  eval::eval_inputs is = ie;
  is.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", pos.view()}, {"kv_read_map", read.view()}};
  std::vector<tensor> states;
  for (const auto& s : gs->states()) states.emplace_back(gs->info(s.in).type.type, gs->info(s.in).type.dims);
  for (std::size_t i = 0; i < states.size(); ++i) is.states.emplace(gs->states()[i].name, states[i].view());
  auto hs = eval::evaluate(*gs, is);
  ASSERT_TRUE(hs) << hs.error().message();
  const auto& a = he->outputs.at("hidden");
  const auto& b = hs->outputs.at("hidden");
  ASSERT_EQ(a.numel(), b.numel());
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.as<float>()[i], b.as<float>()[i], 1e-5);
}

}  // namespace
}  // namespace troupe::families

namespace troupe::families {
namespace {

TEST(model_handle, carries_the_checkpoints_own_text_codec) {
  fixture_dims d;
  d.vocab = 300;
  d.hidden = 64;
  d.ffn = 96;
  d.head_dim = 16;
  const auto gguf = scratch("codec.gguf");
  ASSERT_TRUE(write_fixture("llama", d, gguf, true));
  auto h = model_handle::load(gguf, registry::builtin());
  ASSERT_TRUE(h) << message(h.error());
  ASSERT_NE((*h)->text(), nullptr) << (*h)->text_problem();
  EXPECT_EQ((*h)->text()->vocab_size(), 300u);
  EXPECT_EQ((*h)->text()->token_string(1), "<s>");
  // Byte tokens decode to their bytes: <0x68> <0x69> is "hi".
  const std::vector<text::token_id> hi = {3 + 0x68, 3 + 0x69};
  EXPECT_EQ((*h)->text()->decode(hi), "hi");

  const auto hf = scratch("codec-hf");
  ASSERT_TRUE(write_fixture("llama", d, hf, false));
  auto g = model_handle::load(hf, registry::builtin());
  ASSERT_TRUE(g);
  EXPECT_EQ((*g)->text(), nullptr);
  EXPECT_NE((*g)->text_problem().find("tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace troupe::families

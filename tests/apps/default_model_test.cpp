// The embedded default model (models/troupe-kjv*, trained by tools/train_default_model.py): found beside
// the binary without the source tree, its two forms (GGUF and the Hugging Face directory) tokenize and
// generate alike on troupe's CPU executor, troupe's loss on the held-out verses is the loss the training
// script measured, and what it writes is made of the corpus's words. Parity with llama.cpp on the GGUF is
// in tests/families/llama_cpp_parity_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "apps/default_model.hpp"
#include "apps/exec_runner.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"

namespace troupe::app {
namespace {

namespace fs = std::filesystem;
const fs::path source_models = fs::path(TROUPE_SOURCE_DIR) / "models";

std::shared_ptr<const families::model_handle> load(const fs::path& p) {
  auto h = families::model_handle::load(p, families::registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  return h ? *h : nullptr;
}

fs::path found() {
  ::unsetenv("TROUPE_DEFAULT_MODEL");
  auto p = find_default_model();
  EXPECT_TRUE(p) << (p ? "" : p.error());
  return p ? *p : fs::path{};
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

std::vector<std::int32_t> greedy(const families::model_handle& h, exec::executor& ex, std::vector<std::int32_t> prompt,
                                 int steps) {
  auto run = exec_runner::create(std::shared_ptr<const families::model_handle>(&h, [](auto*) {}), ex, 256);
  EXPECT_TRUE(run) << (run ? "" : run.error());
  std::vector<std::int32_t> out;
  if (!run) return out;
  auto logits = run->feed(prompt);
  for (int i = 0; i < steps && logits; ++i) {
    const auto id = static_cast<std::int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    out.push_back(id);
    const std::int32_t next[] = {id};
    logits = run->feed(next);
  }
  EXPECT_TRUE(logits) << (logits ? "" : logits.error());
  return out;
}

TEST(default_model, is_found_beside_the_binary_not_in_the_source_tree) {
  const auto p = found();
  ASSERT_TRUE(fs::exists(p)) << p;
  const auto rel = fs::weakly_canonical(p).lexically_relative(fs::weakly_canonical(source_models));
  EXPECT_TRUE(rel.empty() || *rel.begin() == "..") << p << " is read from the source tree";
  EXPECT_EQ(p.filename(), "troupe-kjv.gguf");
  EXPECT_TRUE(fs::exists(p.parent_path() / "troupe-kjv" / "model.safetensors"));
}

TEST(default_model, an_explicit_environment_variable_wins_or_is_refused) {
  ::setenv("TROUPE_DEFAULT_MODEL", "/nonexistent/model.gguf", 1);
  auto p = find_default_model();
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().find("/nonexistent/model.gguf"), std::string::npos) << p.error();
  auto given = model_or_default("/some/model.gguf", "test");
  ASSERT_TRUE(given);
  EXPECT_EQ(*given, "/some/model.gguf");
  ::setenv("TROUPE_DEFAULT_MODEL", (source_models / "troupe-kjv").c_str(), 1);
  p = find_default_model();
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(*p, source_models / "troupe-kjv");
  ::unsetenv("TROUPE_DEFAULT_MODEL");
}

TEST(default_model, both_forms_tokenize_and_generate_alike) {
  const auto gguf_path = found();
  const auto gguf = load(gguf_path);
  const auto hf = load(gguf_path.parent_path() / "troupe-kjv");
  ASSERT_TRUE(gguf && hf);
  ASSERT_NE(gguf->text(), nullptr) << gguf->text_problem();
  ASSERT_NE(hf->text(), nullptr) << hf->text_problem();
  const auto verses = lines_of(source_models / "troupe-kjv.heldout.txt");
  ASSERT_GE(verses.size(), 600u);
  for (const auto& v : verses) {
    auto a = gguf->text()->encode(v);
    auto b = hf->text()->encode(v);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(*a, *b) << v;
    EXPECT_EQ(gguf->text()->decode(*a, true), v);
  }
  exec::cpu::cpu_executor ex({2, std::nullopt});
  const auto prompt = *gguf->text()->encode("And God said");
  const auto from_gguf = greedy(*gguf, ex, prompt, 64);
  const auto from_hf = greedy(*hf, ex, prompt, 64);
  EXPECT_EQ(from_gguf, from_hf);
  std::printf("[ default ] And God said -> %s\n", gguf->text()->decode(from_gguf, false).c_str());
}

// Mean negative log-likelihood per predicted token over held-out verses, each read as the training
// script framed it: <|begin_of_text|> verse <|end_of_text|>.
TEST(default_model, held_out_loss_is_the_trained_one) {
  const auto h = load(found());
  ASSERT_TRUE(h && h->text());
  std::ifstream rf(source_models / "troupe-kjv.training.json");
  const auto report = nlohmann::json::parse(rf, nullptr, false);
  ASSERT_FALSE(report.is_discarded());
  const double trained = report["held_out_loss"].get<double>();
  const auto verses = lines_of(source_models / "troupe-kjv.heldout.txt");
  exec::cpu::cpu_executor ex({2, std::nullopt});
  auto run = exec_runner::create(h, ex, 256);
  ASSERT_TRUE(run) << run.error();
  const auto eos = h->text()->encode("<|end_of_text|>", false);
  ASSERT_TRUE(eos && eos->size() == 1u);
  const std::int64_t vocab = h->model().config().vocab;
  double total = 0;
  std::int64_t count = 0;
  for (std::size_t i = 0; i < verses.size(); i += 4) {
    auto ids = *h->text()->encode(verses[i]);
    ids.push_back(eos->front());
    ASSERT_TRUE(run->reset());
    const std::vector<std::int32_t> input(ids.begin(), ids.end() - 1);
    auto logits = run->feed(input, true);
    ASSERT_TRUE(logits) << logits.error();
    for (std::size_t t = 0; t + 1 < ids.size(); ++t) {
      const float* row = logits->data() + t * vocab;
      double m = -INFINITY, s = 0;
      for (std::int64_t v = 0; v < vocab; ++v) m = std::max(m, static_cast<double>(row[v]));
      for (std::int64_t v = 0; v < vocab; ++v) s += std::exp(row[v] - m);
      total += m + std::log(s) - row[ids[t + 1]];
      ++count;
    }
  }
  const double loss = total / static_cast<double>(count);
  std::printf("[ default ] held-out loss %.3f over %lld tokens (training report: %.3f; uniform: %.3f)\n", loss,
              static_cast<long long>(count), trained, std::log(static_cast<double>(vocab)));
  EXPECT_NEAR(loss, trained, 0.25);
  EXPECT_LT(loss, 0.6 * std::log(static_cast<double>(vocab)));
}

TEST(default_model, writes_the_words_of_its_corpus) {
  const auto h = load(found());
  ASSERT_TRUE(h && h->text());
  const auto list = lines_of(source_models / "troupe-kjv.words.txt");
  const std::set<std::string> words(list.begin(), list.end());
  ASSERT_GT(words.size(), 10000u);
  exec::cpu::cpu_executor ex({2, std::nullopt});
  int total = 0, known = 0;
  for (const char* prompt : {"And God said", "The LORD is my shepherd", "In the beginning", "Blessed are the"}) {
    const auto out = h->text()->decode(greedy(*h, ex, *h->text()->encode(prompt), 48), true);
    const std::regex word("[A-Za-z]+");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), word); it != std::sregex_iterator(); ++it) {
      ++total;
      known += words.contains(it->str()) ? 1 : 0;
    }
    std::printf("[ default ] %s -> %s\n", prompt, out.c_str());
  }
  EXPECT_GE(total, 40);
  EXPECT_GE(known, total * 95 / 100) << known << " of " << total << " words are the corpus's";
}

}  // namespace
}  // namespace troupe::app

// The troupe command line. Each subcommand parses its options here and runs a function of apps/.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "apps/generate.hpp"
#include "apps/inspect.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: an LLM inference cluster"};
  app.require_subcommand(1);
  int rc = 0;

  app.add_subcommand("version", "print the version")->callback([] { std::puts("troupe 0.1.0"); });

  troupe::app::inspect_options inspect;
  auto* ins = app.add_subcommand("inspect", "print a checkpoint's format, configuration, tensors and formats");
  ins->add_option("--model", inspect.model, "a GGUF file, a .safetensors file or a Hugging Face directory")->required();
  ins->add_flag("--json", inspect.json, "one JSON object");
  ins->callback([&] { rc = troupe::app::run_inspect(inspect); });

  troupe::app::selfcheck_options check;
  auto* sc = app.add_subcommand("selfcheck", "write, load, trace and evaluate a generated checkpoint in every storage form");
  sc->add_option("--dir", check.dir, "where to write the checkpoints (kept); a temporary directory otherwise");
  sc->callback([&] { rc = troupe::app::run_selfcheck(check); });

  troupe::app::generate_options gen;
  std::string prompt_ids;
  auto* g = app.add_subcommand("generate", "continue a prompt");
  g->add_option("--model", gen.model, "a GGUF file or a Hugging Face directory");
  auto* text = g->add_option("--prompt", gen.prompt, "prompt text");
  auto* ids = g->add_option("--prompt-ids", prompt_ids, "comma-separated token ids, used exactly as given (no bos added)");
  text->excludes(ids);
  g->add_option("--max-tokens", gen.max_tokens, "tokens to generate")->check(CLI::Range(0, 1 << 20));
  g->add_option("--temperature", gen.temperature, "0 is greedy")->check(CLI::Range(0.0, 100.0));
  g->add_option("--top-k", gen.top_k, "0 keeps every token")->check(CLI::Range(0, 1 << 30));
  g->add_option("--top-p", gen.top_p)->check(CLI::Range(0.0, 1.0));
  g->add_option("--seed", gen.seed);
  g->add_option("--logprobs", gen.logprobs, "the top K log-probabilities per generated position")->check(CLI::Range(0, 1 << 20));
  g->add_option("--backend", gen.backend, "cpu, oracle or cuda");
  g->add_option("--threads", gen.threads);
  g->add_flag("--json", gen.json, "one JSON object: tokens, text, logprobs");
  g->callback([&] {
    if (!ids->empty()) {
      gen.has_prompt_ids = true;
      std::size_t at = 0;
      while (at <= prompt_ids.size()) {
        const auto comma = prompt_ids.find(',', at);
        const auto item = prompt_ids.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        try {
          std::size_t used = 0;
          const long v = std::stol(item, &used);
          if (used != item.size() || v < 0 || v > 0x7fffffff) throw std::invalid_argument(item);
          gen.prompt_ids.push_back(static_cast<std::int32_t>(v));
        } catch (const std::exception&) {
          std::fprintf(stderr, "troupe generate: --prompt-ids: '%s' is not a token id\n", item.c_str());
          rc = 2;
          return;
        }
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    }
    rc = troupe::app::run_generate(gen);
  });

  troupe::app::fixture_options fix;
  auto* fx = app.add_subcommand("fixture", "write a family's tiny deterministic test checkpoint");
  fx->add_option("--family", fix.family)->required();
  fx->add_option("--out", fix.out, "a directory (Hugging Face form) or, with --gguf, a file")->required();
  fx->add_flag("--gguf", fix.gguf, "write the GGUF form");
  fx->add_option("--dims", fix.dims, "vocab hidden ffn layers heads kv_heads head_dim (any prefix)")->delimiter(',');
  fx->callback([&] { rc = troupe::app::run_fixture(fix); });

  app.add_subcommand("feature-matrix", "print the feature matrix (docs/feature-matrix.md)")->callback([&] {
    rc = troupe::app::run_feature_matrix();
  });

  CLI11_PARSE(app, argc, argv);
  return rc;
}

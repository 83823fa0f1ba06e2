// The troupe command line. Each subcommand parses its options here and runs a function of apps/.
#include <CLI/CLI.hpp>

#include <cstdio>

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

  CLI11_PARSE(app, argc, argv);
  return rc;
}

#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"troupe: an LLM inference cluster"};
  app.require_subcommand(1);
  app.add_subcommand("version", "print the version")->callback([] { std::puts("troupe 0.1.0"); });
  CLI11_PARSE(app, argc, argv);
  return 0;
}

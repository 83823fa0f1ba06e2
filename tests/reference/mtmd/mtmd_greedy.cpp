// llama.cpp's multimodal reference (libmtmd of the llama.cpp that node-llama-cpp 3.21.1 ships):
// a text GGUF, its mmproj GGUF, a prompt holding the media marker and an image file; prints as JSON
// the prompt's tokens (image positions as -1), the greedy tokens of `n` steps and each step's
// log-probability of its pick (log-softmax of the logits). Built by scripts/build-llama-mtmd; a
// reference for tests, never part of troupe.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

static void quiet(ggml_log_level, const char*, void*) {}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s TEXT.gguf MMPROJ.gguf IMAGE PROMPT|@FILE N\n", argv[0]);
    return 2;
  }
  const std::string text_path = argv[1], mmproj = argv[2], image = argv[3];
  std::string prompt = argv[4];
  if (!prompt.empty() && prompt[0] == '@') {  // @FILE: the prompt is the file's bytes (a shell would drop trailing newlines)
    std::FILE* f = std::fopen(prompt.c_str() + 1, "rb");
    if (!f) return std::fprintf(stderr, "cannot read %s\n", prompt.c_str() + 1), 1;
    prompt.clear();
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) prompt.append(buf, n);
    std::fclose(f);
  }
  const int n = std::atoi(argv[5]);
  llama_log_set(quiet, nullptr);
  mtmd_helper_log_set(quiet, nullptr);
  llama_backend_init();
  auto mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(text_path.c_str(), mp);
  if (!model) return std::fprintf(stderr, "cannot load %s\n", text_path.c_str()), 1;
  auto cp = llama_context_default_params();
  cp.n_ctx = 4096;
  cp.n_batch = 4096;
  cp.n_ubatch = 4096;
  cp.n_threads = cp.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, cp);
  auto mpar = mtmd_context_params_default();
  mpar.use_gpu = false;
  mpar.n_threads = 2;
  mpar.warmup = false;
  mpar.print_timings = false;
  mtmd_context* mctx = mtmd_init_from_file(mmproj.c_str(), model, mpar);
  if (!mctx) return std::fprintf(stderr, "cannot load %s\n", mmproj.c_str()), 1;
  auto bw = mtmd_helper_bitmap_init_from_file(mctx, image.c_str(), false, mtmd_helper_init_opt_default());
  mtmd_bitmap* bmp = bw.bitmap;
  if (!bmp) return std::fprintf(stderr, "cannot read %s\n", image.c_str()), 1;
  mtmd_input_chunks* chunks = mtmd_input_chunks_init();
  mtmd_input_text txt{prompt.c_str(), prompt.size(), false, true};
  const mtmd_bitmap* bitmaps[] = {bmp};
  if (int r = mtmd_tokenize(mctx, chunks, &txt, bitmaps, 1); r != 0) return std::fprintf(stderr, "tokenize: %d\n", r), 1;
  std::string toks;
  for (size_t i = 0; i < mtmd_input_chunks_size(chunks); ++i) {
    const auto* c = mtmd_input_chunks_get(chunks, i);
    if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
      size_t k = 0;
      const llama_token* t = mtmd_input_chunk_get_tokens_text(c, &k);
      for (size_t j = 0; j < k; ++j) toks += (toks.empty() ? "" : ",") + std::to_string(t[j]);
    } else {
      for (size_t j = 0; j < mtmd_input_chunk_get_n_tokens(c); ++j) toks += (toks.empty() ? "" : ",") + std::string("-1");
    }
  }
  llama_pos n_past = 0;
  if (mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, 4096, true, &n_past) != 0) return std::fprintf(stderr, "eval failed\n"), 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int V = llama_vocab_n_tokens(vocab);
  std::string out, lps;
  for (int s = 0; s < n; ++s) {
    const float* lg = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int v = 1; v < V; ++v)
      if (lg[v] > lg[best]) best = v;
    double mx = lg[best], sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(lg[v]) - mx);
    const double lp = -std::log(sum);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", lp);
    out += (out.empty() ? "" : ",") + std::to_string(best);
    lps += (lps.empty() ? "" : ",") + std::string(buf);
    llama_token t = best;
    llama_batch b = llama_batch_get_one(&t, 1);
    if (llama_decode(ctx, b) != 0) return std::fprintf(stderr, "decode failed\n"), 1;
  }
  std::printf("{\"prompt\":[%s],\"tokens\":[%s],\"logprobs\":[%s]}\n", toks.c_str(), out.c_str(), lps.c_str());
  mtmd_input_chunks_free(chunks);
  mtmd_bitmap_free(bmp);
  mtmd_free(mctx);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

// The troupe command line. Each subcommand parses its options here and runs a function of apps/.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "apps/chat.hpp"
#include "apps/chat_template_cmd.hpp"
#include "apps/embed.hpp"
#include "apps/bench.hpp"
#include "apps/generate.hpp"
#include "apps/inspect.hpp"
#include "apps/plan.hpp"
#include "apps/cluster_module.hpp"
#include "apps/serve.hpp"
#include "apps/default_model.hpp"
#include "cluster/sim.hpp"
#include "apps/cluster_cmd.hpp"
#include "apps/tokenize.hpp"

namespace {

// --speculative, --draft-model and --draft-tokens, as generate, bench, serve and deploy take them.
void add_speculation_flags(CLI::App* cmd, troupe::app::speculation_flags& f) {
  cmd->add_option("--speculative", f.speculative,
                  "speculative decoding: ngram[:K] (prompt-lookup drafts) or mtp[:K] (the model's multi-token-prediction layer); K drafts per verify step");
  cmd->add_option("--draft-model", f.draft_model, "speculative decoding with a smaller checkpoint of the same vocabulary drafting greedily");
  cmd->add_option("--draft-tokens", f.draft_tokens, "drafts per verify step (K, default 4)")->check(CLI::Range(1, 16));
}

}  // namespace

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

  troupe::app::tokenize_options tokenize;
  auto* tk = app.add_subcommand("tokenize", "print the token ids of a text, as a JSON array");
  tk->add_option("--tokenizer", tokenize.tokenizer, "a tokenizer.json, a model directory or a GGUF file")->required();
  tk->add_flag("--no-special", tokenize.no_special, "add no bos/eos (Hugging Face's add_special_tokens=False)");
  auto* tk_text = tk->add_option("text", tokenize.text, "the text to encode");
  auto* tk_jsonl = tk->add_option("--jsonl", tokenize.jsonl, "a file of JSON strings, one per line; prints one array per line");
  tk_text->excludes(tk_jsonl);
  tk->callback([&] {
    if (tk_text->empty() && tk_jsonl->empty()) {
      std::fputs("troupe tokenize: give TEXT or --jsonl FILE\n", stderr);
      rc = 2;
      return;
    }
    rc = troupe::app::run_tokenize(tokenize);
  });

  troupe::app::selfcheck_options check;
  auto* sc = app.add_subcommand("selfcheck", "write, load, trace and evaluate a generated checkpoint in every storage form");
  sc->add_option("--dir", check.dir, "where to write the checkpoints (kept); a temporary directory otherwise");
  sc->callback([&] { rc = troupe::app::run_selfcheck(check); });

  troupe::app::chat_options chat_opt;
  auto* ch = app.add_subcommand("chat", "an interactive chat in the terminal, with the model's chat template");
  ch->add_option("--model", chat_opt.model, "a GGUF file or a Hugging Face directory (default: the embedded model)");
  ch->add_option("--system", chat_opt.system, "the system prompt");
  ch->add_option("--temperature", chat_opt.temperature, "0 is greedy")->check(CLI::Range(0.0, 100.0));
  ch->add_option("--top-p", chat_opt.top_p)->check(CLI::Range(0.0, 1.0));
  ch->add_option("--max-tokens", chat_opt.max_tokens, "tokens per answer")->check(CLI::Range(1, 1 << 20));
  ch->add_option("--context", chat_opt.context, "positions per conversation (at most the model's)")->check(CLI::Range(16, 1 << 20));
  ch->add_option("--seed", chat_opt.seed, "0: a fresh seed per session");
  ch->add_option("--threads", chat_opt.threads);
  ch->callback([&] { rc = troupe::app::run_chat(chat_opt); });

  troupe::app::embed_options embed_opt;
  auto* em = app.add_subcommand("embed", "embeddings of texts through the encode program, pooled as the model declares");
  em->add_option("--model", embed_opt.model, "a GGUF file or a Hugging Face directory (default: the embedded model)");
  em->add_option("--input", embed_opt.inputs, "a text to embed (repeat the flag); none: each line of stdin");
  em->add_option("--pooling", embed_opt.pooling, "mean, cls or last (default: what the checkpoint declares, else last)");
  em->add_flag("--no-normalize", embed_opt.no_normalize, "raw pooled vectors, not L2-normalized");
  em->add_option("--threads", embed_opt.threads);
  em->callback([&] { rc = troupe::app::run_embed(embed_opt); });

  troupe::app::generate_options gen;
  std::string prompt_ids;
  auto* g = app.add_subcommand("generate", "continue a prompt");
  g->add_option("--model", gen.model, "a GGUF file or a Hugging Face directory (default: the embedded model)");
  auto* text = g->add_option("--prompt", gen.prompt, "prompt text");
  auto* ids = g->add_option("--prompt-ids", prompt_ids, "comma-separated token ids, used exactly as given (no bos added)");
  text->excludes(ids);
  g->add_option("--max-tokens", gen.max_tokens, "tokens to generate")->check(CLI::Range(0, 1 << 20));
  g->add_option("--temperature", gen.temperature, "0 is greedy")->check(CLI::Range(0.0, 100.0));
  g->add_option("--top-k", gen.top_k, "0 keeps every token")->check(CLI::Range(0, 1 << 30));
  g->add_option("--top-p", gen.top_p)->check(CLI::Range(0.0, 1.0));
  g->add_option("--seed", gen.seed);
  g->add_option("--logprobs", gen.logprobs, "the top K log-probabilities per generated position")->check(CLI::Range(0, 1 << 20));
  add_speculation_flags(g, gen.speculation);
  g->add_option("--beams", gen.beams, "beam search of this width (greedy; every hypothesis printed, the best as the output)")->check(CLI::Range(1, 10));
  g->add_option("--length-penalty", gen.length_penalty, "beam search: hypotheses ranked by logprob / length^P");
  g->add_flag("--early-stopping", gen.early_stopping, "beam search: end once --beams hypotheses are in");
  g->add_option("--chain", gen.chain, "chained decode: up to K decode steps per executor call when nothing needs the host between tokens")
      ->check(CLI::Range(1, 1024));
  g->add_option("--mmproj", gen.mmproj, "a vision tower: llama.cpp's mmproj GGUF beside a GGUF --model");
  g->add_option("--image", gen.images, "an image file (PNG, JPEG, ...) for each image marker in the prompt (Gemma 3: <start_of_image>); repeat the flag");
  g->add_option("--adapter", gen.adapter, "a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) applied to the request");
  g->add_option("--backend", gen.backend, "cpu, oracle or cuda");
  g->add_option("--device", gen.device, "--backend cuda: the GPU to run on")->check(CLI::Range(0, 1024));
  g->add_option("--threads", gen.threads);
  g->add_option("--tensor-parallel", gen.tensor_parallel,
                "split the model over N simulated devices (threads of this process, each its own executor over its "
                "shard; an all-reduce joins them)")->check(CLI::Range(1, 64));
  g->add_option("--pipeline-parallel", gen.pipeline_parallel,
                "split the model's layers into M stages (simulated devices of this process; each stage passes its "
                "activations to the next); composes with --tensor-parallel")->check(CLI::Range(1, 64));
  g->add_option("--expert-parallel", gen.expert_parallel,
                "a mixture-of-experts model's replica over N simulated devices that hold E / N whole experts each "
                "(attention split N ways as --tensor-parallel N; equal to it when both are given); composes with "
                "--pipeline-parallel")->check(CLI::Range(1, 64));
  g->add_option("--kv-type", gen.kv_type, "the KV cache's element type: f32, f16 (default, as llama.cpp), bf16 or q8_0 (an f16 scale per 32 values)")->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  g->add_flag("--json", gen.json, "one JSON object: tokens, text, logprobs");
  auto* gs = g->add_option("--json-schema", gen.json_schema, "constrain the output to JSON valid against this schema (text, or @file)");
  auto* go = g->add_flag("--json-object", gen.json_object, "constrain the output to a JSON object");
  auto* gr = g->add_option("--regex", gen.regex, "constrain the output to a full match of this regular expression");
  auto* gg = g->add_option("--grammar", gen.grammar, "constrain the output to this GBNF grammar, llama.cpp's language (text, or @file)");
  auto* gc = g->add_option("--choice", gen.choices, "constrain the output to one of these strings (repeat the flag)");
  for (auto* a : {gs, go, gr, gg, gc})
    for (auto* b : {gs, go, gr, gg, gc})
      if (a != b) a->excludes(b);
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
  fx->add_option("--family", fix.family, "a family, or gemma3_vl: a vision-language fixture, --out DIR holding hf/, text.gguf, mmproj.gguf and two test images")->required();
  fx->add_option("--out", fix.out, "a directory (Hugging Face form) or, with --gguf, a file")->required();
  fx->add_flag("--gguf", fix.gguf, "write the GGUF form");
  fx->add_option("--type", fix.type, "matrix storage: f32, f16, bf16, or (GGUF) q8_0, q4_0, q4_k, q6_k, ...");
  fx->add_flag("--tied", fix.tied, "no separate output head (logits reuse the embedding)");
  fx->add_flag("--mtp", fix.mtp, "deepseek_v3, qwen3_next: a multi-token-prediction layer (the model's draft program; --speculative mtp)");
  fx->add_flag("--legacy-gguf", fix.legacy_gguf, "routed families: the GGUF layout of older converters (a tensor per expert; DeepSeek's attn_kv_b)");
  fx->add_option("--dims", fix.dims, "vocab hidden ffn layers heads kv_heads head_dim max_positions (any prefix)")->delimiter(',');
  fx->add_option("--experts", fix.experts, "routed families: experts, experts per token, expert width, shared width (any prefix)")
      ->delimiter(',');
  fx->add_option("--ssm", fix.ssm,
                 "recurrent families: state size, B/C groups, conv kernel, expansion (any prefix; qwen3_next: head width, key heads, "
                 "kernel, value heads per key head)")
      ->delimiter(',');
  fx->add_option("--lora-over", fix.lora_over, "write a PEFT LoRA adapter over this Hugging Face checkpoint to --out (every q/k/v/o and gate/up/down linear)");
  fx->add_option("--lora-rank", fix.lora_rank, "--lora-over: the adapter's rank")->check(CLI::Range(1, 256));
  fx->add_option("--seed", fix.seed, "--lora-over: the adapter's seed");
  fx->add_option("--merged-with", fix.merged_with, "with --lora-over BASE: write BASE with this adapter merged into its weights to --out");
  fx->add_option("--lora-to-gguf", fix.lora_to_gguf, "write this PEFT adapter as llama.cpp's GGUF LoRA for --gguf-base to --out");
  fx->add_option("--gguf-base", fix.gguf_base, "--lora-to-gguf: the GGUF base the adapter goes with");
  fx->add_option("--hf-quant", fix.hf_quant,
                 "dense families, Hugging Face form: the linears as a quantizer stores them (gptq, gptq-sym, gptq-act, gptq-3bit, gptq-8bit, "
                 "gptq-v2, awq, fp8-block, fp8-channel, ct-int4, ct-int4-asym, ct-int8)");
  fx->add_flag("--hf-quant-reference", fix.hf_quant_reference, "with --hf-quant: the f32 checkpoint of the values the quantized one decodes to");
  fx->callback([&] { rc = troupe::app::run_fixture(fix); });

  troupe::app::bench_options bench;
  troupe::app::plan_options plan;
  auto* pl = app.add_subcommand("plan", "where a model fits: replicas, pipeline stages and tensor-parallel groups on an inventory");
  pl->add_option("--model", plan.model, "a GGUF file or Hugging Face directory (default: the embedded model)");
  pl->add_option("--node", plan.nodes, "a node: ID=KIND:MEMORY[*COUNT][,...], e.g. a=cuda:80GiB*8 (repeat for more nodes)")->required();
  pl->add_option("--goal", plan.goal, "latency (tensor parallel first), capacity (the most KV per replica) or throughput (the most replicas)");
  pl->add_option("--max-tensor-parallel", plan.max_tensor_parallel, "at most this many ranks per stage")->check(CLI::Range(1, 4096));
  pl->add_option("--replicas", plan.replicas, "exactly this many replicas")->check(CLI::Range(1, 1 << 20));
  pl->add_option("--min-kv-tokens", plan.min_kv_tokens, "KV tokens every replica holds at least")->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  pl->add_flag("--expert-parallel", plan.expert_parallel,
               "a routed model's ranks hold whole experts (ceil(experts / ranks) each) instead of a slice of every expert");
  pl->add_option("--kv-type", plan.kv_type, "the KV cache's element type the deployment would use: f32, f16 (default), bf16 or q8_0")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  pl->add_flag("--json", plan.json);
  pl->callback([&] { rc = troupe::app::run_plan(plan); });

  auto* bn = app.add_subcommand("bench", "prefill and decode tokens per second on the CPU executor");
  bn->add_option("--model", bench.model)->required();
  bn->add_option("--prompt-len", bench.prompt_len)->check(CLI::Range(1, 1 << 20));
  bn->add_option("--gen", bench.gen)->check(CLI::Range(1, 1 << 20));
  bn->add_option("--batch", bench.batch)->check(CLI::Range(1, 4096));
  bn->add_option("--threads", bench.threads)->check(CLI::Range(0, 4096));
  bn->add_option("--runs", bench.runs, "measured runs (after one warm-up); medians are printed")->check(CLI::Range(1, 1000));
  bn->add_flag("--json", bench.json);
  bn->add_option("--backend", bench.backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  bn->add_option("--device", bench.device, "--backend cuda: the GPU to run on")->check(CLI::Range(0, 1024));
  bn->add_flag("--actors", bench.actors, "with --batch N: N jobs through the actor cluster vs the driver directly");
  bn->add_option("--tensor-parallel", bench.tensor_parallel,
                 "one sequence on 1 rank and on N in-process ranks (--threads shared between them): tokens/s and the collectives' share")
      ->check(CLI::Range(2, 64));
  bn->add_option("--pipeline-parallel", bench.pipeline_parallel,
                 "one sequence through the driver on 1 x 1 and on (--tensor-parallel) x M stages: tokens/s")
      ->check(CLI::Range(2, 64));
  add_speculation_flags(bn, bench.speculation);
  bn->add_option("--chain", bench.chain, "chained decode: --batch sequences with and without K steps per executor call (tokens/s, host share)")
      ->check(CLI::Range(2, 1024));
  bn->add_option("--kv-type", bench.kv_type, "the KV cache's element type: f32, f16 (default, as llama.cpp), bf16 or q8_0 (an f16 scale per 32 values)")->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  bn->add_option("--prompt", bench.prompt, "random or repetitive (a phrase of 8 tokens over and over)")->check(CLI::IsMember({"random", "repetitive"}));
  bn->callback([&] { rc = troupe::app::run_bench(bench); });

  troupe::app::serve_options serve;
  auto* sv = app.add_subcommand("serve", "a single-machine cluster with the OpenAI-compatible HTTP API");
  sv->add_option("--model", serve.model, "a GGUF file or a Hugging Face directory (default: the embedded model)");
  sv->add_option("--host", serve.host, "address to listen on (default 127.0.0.1)");
  sv->add_option("--port", serve.port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  sv->add_option("--api-key-file", serve.api_key_file, "one API key a line; none: no authentication");
  sv->add_option("--replicas", serve.replicas)->check(CLI::Range(1, 64));
  sv->add_option("--max-rows", serve.max_rows, "sequences decoding together per replica")->check(CLI::Range(1, 1024));
  sv->add_option("--capacity", serve.capacity, "positions per sequence, prompt and output (default: the model's, at most 2048)")->check(CLI::Range(16, 1 << 20));
  sv->add_option("--threads", serve.threads, "compute threads per replica (0: one per core)")->check(CLI::Range(0, 4096));
  sv->add_option("--tensor-parallel", serve.tensor_parallel, "split each replica over N executors (simulated devices), each over its shard")
      ->check(CLI::Range(1, 64));
  sv->add_option("--expert-parallel", serve.expert_parallel,
                 "a mixture-of-experts replica over N executors holding E / N whole experts each (attention split N ways)")
      ->check(CLI::Range(1, 64));
  sv->add_option("--pipeline-parallel", serve.pipeline_parallel, "split each replica's layers into M stages (simulated devices), each passing its activations on")
      ->check(CLI::Range(1, 64));
  sv->add_option("--kv-type", serve.kv_type, "the KV cache's element type: f32, f16 (default, as llama.cpp), bf16 or q8_0 (an f16 scale per 32 values)")->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  sv->add_option("--max-outstanding", serve.max_outstanding, "jobs admitted and not finished; more get 429")->check(CLI::Range(1, 1 << 20));
  sv->add_option("--mmproj", serve.mmproj, "a vision tower: llama.cpp's mmproj GGUF beside a GGUF --model (image_url content parts, docs/vision.md)");
  sv->add_option("--lora-modules", serve.lora_modules,
                 "LoRA adapters NAME=PATH (PEFT directories), served as model NAME or SERVED:NAME (repeat or comma-separate)")
      ->delimiter(',');
  sv->add_option("--max-loras", serve.max_loras, "adapters resident at once per replica (0: all of --lora-modules)")->check(CLI::Range(0, 64));
  sv->add_option("--max-lora-rank", serve.max_lora_rank, "the largest adapter rank served")->check(CLI::Range(1, 256));
  add_speculation_flags(sv, serve.speculation);
  sv->callback([&] { rc = troupe::app::through_cluster_module("serve", [&](const auto& m) { return m.serve(serve); }); });

  troupe::cluster::sim_options sim;
  bool sim_no_model = false;
  auto* sm = app.add_subcommand("sim", "a simulated cluster of node processes on loopback, with fault injection on stdin");
  sm->add_option("--nodes", sim.nodes)->check(CLI::Range(1, 64));
  auto* sim_model = sm->add_option("--model", sim.models, "deploy this checkpoint on the nodes (default: the embedded model); repeat for more models");
  sm->add_flag("--no-model", sim_no_model, "start the nodes with nothing deployed")->excludes(sim_model);
  sm->add_option("--replicas", sim.replicas, "replicas of the model (default: one per node)")->check(CLI::Range(0, 1024));
  sm->add_option("--threads", sim.threads, "compute threads per node")->check(CLI::Range(0, 4096));
  sm->add_option("--max-rows", sim.max_rows)->check(CLI::Range(1, 1024));
  sm->add_option("--capacity", sim.capacity, "positions per sequence (default: the model's, at most 2048)")->check(CLI::Range(16, 1 << 20));
  sm->add_option("--heartbeat-ms", sim.heartbeat_ms)->check(CLI::Range(10, 60000));
  sm->add_option("--timeout-ms", sim.timeout_ms)->check(CLI::Range(50, 600000));
  sm->add_option("--dir", sim.dir, "where the secret and the logs go");
  sm->add_option("--device-memory", sim.device_memory, "each node's simulated CPU device memory, e.g. 8GiB");
  sm->callback([&] {
    // The embedded model when none is named (and --no-model is not given).
    if (sim.models.empty() && !sim_no_model) sim.models.emplace_back();
    for (auto& m : sim.models) {
      auto found = troupe::app::model_or_default(m, "sim");
      if (!found) {
        std::fprintf(stderr, "%s\n", found.error().c_str());
        rc = 2;
        return;
      }
      m = std::move(*found);
    }
    rc = troupe::app::through_cluster_module("sim", [&](const auto& m) { return m.sim(sim); });
  });

  troupe::app::cluster_cmd_options cc;
  auto common = [&](CLI::App* c, const char* flag, const char* what) {
    c->add_option(flag, cc.address, what);
    c->add_option("--secret-file", cc.secret_file, "the cluster's shared secret (16 bytes or more)");
    c->add_option("--cluster-file", cc.cluster_file, "a TOML cluster file (deploy/cluster.example.toml); flags given override it");
    c->add_option("--heartbeat-ms", cc.heartbeat_ms, "middleman heartbeat interval")->check(CLI::Range(10, 60000));
    c->add_option("--timeout-ms", cc.timeout_ms, "a peer silent this long is lost")->check(CLI::Range(50, 600000));
    c->add_option("--tls-cert", cc.tls_cert, "this process's certificate (PEM), for mutual TLS on the links");
    c->add_option("--tls-key", cc.tls_key, "its private key (PEM)");
    c->add_option("--tls-ca", cc.tls_ca, "the CA (PEM) that signs every process of the cluster");
    c->add_flag("--insecure", cc.insecure, "plain links without TLS: only when the address is loopback (tests, one machine)");
  };
  std::string certs_dir = "certs", certs_name;
  int certs_days = 0;
  auto* ce = app.add_subcommand("certs", "make the cluster's CA and its processes' certificates (mutual TLS on every link)");
  ce->require_subcommand(1);
  auto* ci = ce->add_subcommand("init", "make DIR/ca.pem and DIR/ca.key");
  ci->add_option("--dir", certs_dir, "where the CA goes (default: certs)");
  ci->add_option("--days", certs_days, "validity (default 3650)")->check(CLI::Range(1, 36500));
  ci->callback([&] { rc = troupe::app::through_cluster_module("certs", [&](const auto& m) { return m.certs("init", certs_dir, "", certs_days); }); });
  auto* cs = ce->add_subcommand("issue", "make DIR/NAME.pem and DIR/NAME.key signed by the CA in DIR");
  cs->add_option("--dir", certs_dir, "where the CA is (default: certs)");
  cs->add_option("--name", certs_name, "the process's name (a node id, coordinator, gateway, a client)")->required();
  cs->add_option("--days", certs_days, "validity (default 825)")->check(CLI::Range(1, 36500));
  cs->callback([&] { rc = troupe::app::through_cluster_module("certs", [&](const auto& m) { return m.certs("issue", certs_dir, certs_name, certs_days); }); });
  auto* co = app.add_subcommand("coordinator", "run a cluster's coordinator");
  common(co, "--listen", "HOST:PORT to listen on (port 0: any)");
  co->add_option("--port-file", cc.port_file, "write the bound port here");
  co->add_option("--state-dir", cc.state_dir,
                 "keep the deployments' desired state here (fsynced on every change): a restarted coordinator serves them again");
  co->add_option("--progress-timeout-ms", cc.progress_timeout_ms,
                 "a serving replica whose driver answers no progress probe this long (a step that never returns) is declared hung, "
                 "taken out of routing and replaced (default 60000: above the longest step of a large model on a CPU)")
      ->check(CLI::Range(100, 3600000));
  co->callback([&] { rc = troupe::app::through_cluster_module("coordinator", [&](const auto& m) { return m.coordinator(cc); }); });
  auto* nd = app.add_subcommand("node", "run a node that joins a coordinator");
  common(nd, "--join", "the coordinator's HOST:PORT");
  nd->add_option("--node-id", cc.node_id);
  nd->add_option("--devices", cc.devices, "the device this node's replicas run on: cpu:0 or cuda:N (a GPU)");
  nd->add_option("--threads", cc.threads, "compute threads per executor")->check(CLI::Range(0, 4096));
  nd->add_option("--device-memory", cc.device_memory, "memory the (simulated) device offers its executors, e.g. 8GiB; deployments past it are refused");
  nd->add_option("--max-replicas", cc.max_replicas, "executors (replicas) this node's device may host; 0: no bound")->check(CLI::Range(0, 1024));
  nd->add_option("--collective-host", cc.collective_host,
                 "the address this node's cross-node collectives (pipeline stages on other nodes) listen on; default: the local "
                 "address that routes toward the coordinator");
  nd->callback([&] { rc = troupe::app::through_cluster_module("node", [&](const auto& m) { return m.node(cc); }); });
  auto* dp = app.add_subcommand("deploy", "deploy a model on a running cluster");
  common(dp, "--coordinator", "the coordinator's HOST:PORT");
  dp->add_option("--model", cc.model, "a path every node can read (default: every [[deployment]] of the cluster file)");
  dp->add_option("--replicas", cc.replicas)->check(CLI::Range(1, 1024));
  dp->add_option("--max-rows", cc.max_rows)->check(CLI::Range(1, 1024));
  dp->add_option("--capacity", cc.capacity, "positions per sequence (default: the model's, at most 2048)")->check(CLI::Range(16, 1 << 20));
  dp->add_option("--tensor-parallel", cc.tensor_parallel, "split each replica over N executors on one node, each over its shard")
      ->check(CLI::Range(1, 64));
  dp->add_option("--expert-parallel", cc.expert_parallel,
                 "a mixture-of-experts replica over N executors on one node holding E / N whole experts each")
      ->check(CLI::Range(1, 64));
  dp->add_option("--pipeline-parallel", cc.pipeline_parallel, "split each replica's layers into M stages on one node (composes with --tensor-parallel)")
      ->check(CLI::Range(1, 64));
  dp->add_option("--name", cc.name, "the name jobs use for this model (default: the checkpoint's stem, troupe-kjv for troupe-kjv.gguf)");
  dp->add_option("--plan", cc.plan,
                 "latency, capacity or throughput: the placement planner picks the replicas and the split from the devices the "
                 "nodes declared, overriding --replicas and the parallel options (without --plan or a split flag the coordinator "
                 "plans each replica: a model no node holds is split into pipeline stages across nodes)");

  dp->add_option("--mmproj", cc.mmproj, "a vision tower beside a GGUF --model: llama.cpp's mmproj GGUF, at this path on every node (docs/vision.md)");
  dp->add_option("--kv-type", cc.kv_type, "the KV cache's element type: f32, f16 (default, as llama.cpp), bf16 or q8_0 (an f16 scale per 32 values)")->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  dp->add_flag("--across-nodes", cc.across_nodes,
               "put each pipeline stage on a node of its own (the stages pass activations over Gloo, meeting through the coordinator)");
  dp->add_flag("--progress", cc.progress, "show the replicas' preparation (weights, then each compiled entry) as a progress bar");
  add_speculation_flags(dp, cc.speculation);
  dp->callback([&] { rc = troupe::app::through_cluster_module("deploy", [&](const auto& m) { return m.deploy(cc); }); });
  auto* sb = app.add_subcommand("submit", "submit a job to a running cluster and stream its answer");
  common(sb, "--coordinator", "the coordinator's HOST:PORT");
  sb->add_option("--model", cc.model, "the served model's name (may be left out when the cluster serves one model)");
  auto* stext = sb->add_option("--prompt", cc.prompt, "prompt text");
  auto* sids = sb->add_option("--prompt-ids", cc.prompt_ids, "prompt token ids, used as given")->delimiter(',');
  stext->excludes(sids);
  sb->add_option("--max-tokens", cc.max_tokens)->check(CLI::Range(1, 1 << 20));
  sb->add_option("--temperature", cc.temperature)->check(CLI::Range(0.0, 100.0));
  sb->add_option("--seed", cc.seed);
  sb->add_flag("--json", cc.json);
  sb->add_flag("--ignore-eos", cc.ignore_eos, "keep generating past the model's end of text, to --max-tokens");
  sb->callback([&] {
    cc.has_prompt_ids = sids->count() > 0;
    rc = troupe::app::through_cluster_module("submit", [&](const auto& m) { return m.submit(cc); });
  });
  auto* scl = app.add_subcommand("scale", "set a deployed model's replica count (new ones warm first, removed ones drain)");
  common(scl, "--coordinator", "the coordinator's HOST:PORT");
  scl->add_option("--model", cc.model, "the deployed model's name")->required();
  scl->add_option("--replicas", cc.replicas)->required()->check(CLI::Range(0, 1024));
  scl->callback([&] { rc = troupe::app::through_cluster_module("scale", [&](const auto& m) { return m.scale(cc); }); });
  auto* gwc = app.add_subcommand("gateway", "the OpenAI-compatible HTTP API in front of a running cluster");
  common(gwc, "--coordinator", "the coordinator's HOST:PORT");
  gwc->add_option("--listen", cc.listen, "HOST:PORT for HTTP (default 127.0.0.1:8000)");
  gwc->add_option("--model", cc.model, "the deployed checkpoint's path, for its tokenizer (token strings in logprobs)");
  gwc->add_option("--api-key-file", cc.api_key_file, "one API key a line; none: no authentication");
  gwc->callback([&] { rc = troupe::app::through_cluster_module("gateway", [&](const auto& m) { return m.gateway(cc); }); });
  auto* ss = app.add_subcommand("status", "nodes, replicas and load of a running cluster");
  common(ss, "--coordinator", "the coordinator's HOST:PORT");
  ss->add_flag("--json", cc.json, "every node (id, devices, state) and replica (id, model, nodes, devices, state, load) as JSON");
  ss->callback([&] { rc = troupe::app::through_cluster_module("status", [&](const auto& m) { return m.status(cc); }); });
  auto* tp = app.add_subcommand("top", "a live view of every replica: running and queued jobs, tokens per second, jobs done");
  common(tp, "--coordinator", "the coordinator's HOST:PORT");
  tp->add_option("--interval-ms", cc.interval_ms, "between samples")->check(CLI::Range(50, 60000));
  tp->add_option("--duration", cc.duration_s, "seconds to run (0: until interrupted)")->check(CLI::Range(0.0, 86400.0));
  tp->add_flag("--until-idle", cc.until_idle, "stop once jobs were seen and none is left");
  tp->callback([&] { rc = troupe::app::through_cluster_module("top", [&](const auto& m) { return m.top(cc); }); });
  auto* coll = app.add_subcommand("collectives",
                                "one rank of a Gloo group meeting through the coordinator's rendezvous: checks all_reduce, "
                                "all_gather and send/recv for exact values and times all_reduce (bus bandwidth)");
  common(coll, "--coordinator", "the coordinator's HOST:PORT");
  coll->add_option("--group", cc.group, "the group's name (fresh for each group)");
  coll->add_option("--rank", cc.rank, "this process's rank")->required();
  coll->add_option("--size", cc.size, "ranks in the group")->required()->check(CLI::Range(1, 1024));
  coll->add_option("--floats", cc.floats, "all_reduce length")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  coll->add_option("--rounds", cc.rounds, "timed all_reduce rounds (the median is printed)")->check(CLI::Range(1, 10000));
  coll->callback([&] { rc = troupe::app::through_cluster_module("collectives", [&](const auto& m) { return m.collectives(cc); }); });

  app.add_subcommand("feature-matrix", "print the feature matrix (docs/feature-matrix.md)")->callback([&] {
    rc = troupe::app::run_feature_matrix();
  });

  troupe::app::chat_template_options chat;
  auto* ct = app.add_subcommand("chat-template", "render a conversation with a model's chat template");
  ct->add_option("--model", chat.model, "a model directory, a tokenizer_config.json or a GGUF file")->required();
  ct->add_option("--messages", chat.messages, "a JSON file with the messages array ('-' for stdin)")->required();
  ct->add_flag("--add-generation-prompt", chat.add_generation_prompt, "end with the assistant turn's opening");
  ct->add_option("--tools", chat.tools, "a JSON file with the tools array");
  ct->add_option("--kwargs", chat.kwargs, "a JSON object of extra template variables, e.g. {\"enable_thinking\": false}");
  ct->add_option("--template", chat.template_name, "which of several named templates (default, tool_use, ...)");
  ct->add_option("--date", chat.date, "the date strftime_now prints, YYYY-MM-DD[THH:MM] (UTC now otherwise)");
  ct->callback([&] { rc = troupe::app::run_chat_template(chat); });

  CLI11_PARSE(app, argc, argv);
  return rc;
}

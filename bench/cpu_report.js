// Turns the JSON lines scripts/bench collects (troupe bench and llama-bench per weight type) into
// bench/results/NAME.md (default cpu-qwen2.5-0.5b). usage:
// node bench/cpu_report.js RESULTS THREADS PROMPT GEN [NAME TITLE SHAPE]
const fs = require("fs");
const [file, threads, prompt, gen, nameArg, titleArg, shapeArg] = process.argv.slice(2);
const name = nameArg || "cpu-qwen2.5-0.5b";
const title = titleArg || "Qwen2.5-0.5B shape";
const shape = shapeArg || "vocab 151936, hidden 896, 24 layers, 14 heads, 2 KV heads, ffn 4864, tied embeddings";
const rows = fs.readFileSync(file, "utf8").trim().split("\n").map(l => JSON.parse(l));
const cpu = fs.readFileSync("/proc/cpuinfo", "utf8").match(/model name\s*:\s*(.*)/)[1];
let out = `# CPU: troupe vs llama.cpp, ${title}\n\n`;
out += `Date ${new Date().toISOString().slice(0, 10)}; ${cpu}, ${threads} threads; ISA used by troupe: ${rows[0].troupe.isa}; `;
out += `read bandwidth sampled after each troupe run (2 threads over 1 GiB): per row below.\n`;
out += `Random weights, ${shape}.\n`;
out += `llama.cpp: llama-bench (commit 80fb11a, -DGGML_NATIVE=ON), mean of 3 repetitions; troupe: \`troupe bench\`, median of 3 runs.\n`;
// Routed: the experts a token selects are what it reads (a tied embedding alone also lowers the active
// share: one row per token, not routing).
const routed = rows.some(r => (r.troupe.experts || 0) > 0);
out += `Decode / bandwidth bound: each troupe run's decode against the read bandwidth measured right after it (${routed ? "the active weights, the selected experts' and every other, read once per token" : "weights read once per token"}), median over runs.\n`;
if (routed) out += `Active parameters per token: ${(rows[0].troupe.active_params / 1e6).toFixed(1)}M of ${(rows[0].troupe.params / 1e6).toFixed(1)}M.\n`;
out += `Prefill: ${prompt}-token prompt from an empty cache; decode: ${gen} tokens after it (batch 1; llama-bench's tg at depth ${prompt}).\n\n`;
out += `| weights | file MB | prefill llama.cpp tok/s | prefill troupe tok/s | ratio | decode llama.cpp tok/s | decode troupe tok/s | ratio | read bandwidth GB/s (min-max) | troupe decode / bandwidth bound |\n`;
out += `| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n`;
for (const r of rows) {
  const depth = x => x.n_depth || 0;
  const pp = r.llama.find(x => x.n_prompt > 0 && x.n_gen === 0 && depth(x) === 0);
  const tg = r.llama.find(x => x.n_gen > 0 && x.n_prompt === 0 && depth(x) === Number(prompt)) ||
             r.llama.find(x => x.n_gen > 0 && x.n_prompt === 0);
  const lp = pp ? pp.avg_ts : NaN, lt = tg ? tg.avg_ts : NaN;
  const tp = r.troupe.prefill_tok_s, tt = r.troupe.decode_tok_s;
  out += `| ${r.type} | ${(r.bytes / 1e6).toFixed(0)} | ${lp.toFixed(1)} | ${tp.toFixed(1)} | ${(tp / lp).toFixed(2)} | ${lt.toFixed(2)} | ${tt.toFixed(2)} | ${(tt / lt).toFixed(2)} | ${r.troupe.bandwidth_gb_s.toFixed(1)} (${r.troupe.bandwidth_gb_s_min.toFixed(1)}-${r.troupe.bandwidth_gb_s_max.toFixed(1)}) | ${(100 * r.troupe.decode_fraction_of_bound).toFixed(0)}% |\n`;
}
// The reading of the figures, kept beside the generated table (it survives a rerun).
const notes = `bench/results/${name}.notes.md`;
if (fs.existsSync(notes)) out += "\n" + fs.readFileSync(notes, "utf8");
process.stdout.write(out);
fs.writeFileSync(`bench/results/${name}.md`, out);

// Turns the JSON lines scripts/bench collects for the long-context rows (troupe bench with a KV cache
// type and llama-bench with flash attention and the same cache type, per weight type and depth) into
// bench/results/NAME.md (NAME: long-context unless given). usage: node bench/long_context_report.js
// RESULTS THREADS GEN SHAPE [NAME [LLAMA_PP_NOTE]]
const fs = require("fs");
const [file, threads, gen, shape, nameArg, ppNote] = process.argv.slice(2);
const name = nameArg || "long-context";
const rows = fs.readFileSync(file, "utf8").trim().split("\n").map(l => JSON.parse(l));
const cpu = fs.readFileSync("/proc/cpuinfo", "utf8").match(/model name\s*:\s*(.*)/)[1];
let out = `# CPU: long contexts and KV cache types, troupe vs llama.cpp\n\n`;
out += `Date ${new Date().toISOString().slice(0, 10)}; ${cpu}, ${threads} threads; ISA used by troupe: ${rows[0].troupe.isa}.\n`;
out += `Random weights, ${shape}.\n`;
out += `Each row: a prompt of DEPTH tokens prefilled from an empty cache, then ${gen} tokens decoded after it, `;
out += `with the KV cache in the row's type on both sides. llama.cpp: llama-bench (commit 80fb11a, -DGGML_NATIVE=ON), `;
out += `flash attention on, \`-ctk T -ctv T\`, pp at depth 0${ppNote ? ` (${ppNote})` : ""} and tg at depth DEPTH, one repetition each; troupe: \`troupe bench --kv-type T\`, one run.\n\n`;
out += `| weights | KV | depth | KV bytes/token | prefill llama.cpp tok/s | prefill troupe tok/s | ratio | decode llama.cpp tok/s | decode troupe tok/s | ratio |\n`;
out += `| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n`;
for (const r of rows) {
  const depth = x => x.n_depth || 0;
  const pp = r.llama.find(x => x.n_prompt > 0 && x.n_gen === 0 && depth(x) === 0);
  const tg = (r.llama_tg || r.llama).find(x => x.n_gen > 0 && x.n_prompt === 0 && depth(x) === r.depth);
  const lp = pp ? pp.avg_ts : NaN, lt = tg ? tg.avg_ts : NaN;
  const tp = r.troupe.prefill_tok_s, tt = r.troupe.decode_tok_s;
  out += `| ${r.type} | ${r.kv} | ${r.depth} | ${r.troupe.kv_bytes_per_token} | ${lp.toFixed(1)} | ${tp.toFixed(1)} | ${(tp / lp).toFixed(2)} | ${lt.toFixed(2)} | ${tt.toFixed(2)} | ${(tt / lt).toFixed(2)} |\n`;
}
const notes = `bench/results/${name}.notes.md`;
if (fs.existsSync(notes)) out += "\n" + fs.readFileSync(notes, "utf8");
process.stdout.write(out);
fs.writeFileSync(`bench/results/${name}.md`, out);

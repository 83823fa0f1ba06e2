// llama.cpp (node-llama-cpp 3.21.1, CPU build) as a reference: evaluates a GGUF on a prompt of token
// ids, then greedily generates N tokens, printing for each generated position one JSON line
// {"token": id, "top": [[id, logprob], ...]} with the top K log-probabilities of the full-vocabulary
// softmax of the raw logits. f32 KV cache and flash attention off, so only f32 rounding differs.
// usage: node llama_logprobs.mjs MODEL.gguf IDS_JSON STEPS TOPK
import {createRequire} from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.cwd(), ".reference", "node_modules", "x.js"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

const [modelPath, idsJson, stepsArg, topkArg] = process.argv.slice(2);
const prompt = JSON.parse(idsJson);
const steps = Number(stepsArg);
const topk = Number(topkArg);

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({
  contextSize: 256, batchSize: 256, threads: 2, flashAttention: false,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const sequence = context.getSequence();
const ask = {generateNext: {token: true, probabilities: true, options: {temperature: 0}}};

let input = prompt.map((t, i) => (i === prompt.length - 1 ? [t, ask] : t));
for (let step = 0; step < steps; ++step) {
  const out = await sequence.controlledEvaluate(input);
  const next = out[out.length - 1].next;
  const top = [];
  for (const [id, p] of next.probabilities) {
    top.push([id, Math.log(p)]);
    if (top.length === topk) break;
  }
  const token = top[0][0];
  process.stdout.write(JSON.stringify({token, top}) + "\n");
  input = [[token, ask]];
}
await context.dispose();
await model.dispose();
await llama.dispose();

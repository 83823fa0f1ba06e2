// llama.cpp's embeddings (node-llama-cpp's embedding context, CPU) of token-id inputs on a GGUF, the
// reference for troupe's pooled encode states.
//
//   node tests/reference/llama_embed.mjs MODEL.gguf "1,2,3;4,5,6,7"
//
// Prints ONE JSON array: per input, the vector llama.cpp returns (its pooling as the GGUF declares; a
// causal model without pooling_type: the last token's state after the output norm).
import {createRequire} from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.cwd(), ".reference", "node_modules", "x.js"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

const [modelPath, spec] = process.argv.slice(2);
if (!modelPath || !spec) {
  console.error('usage: node tests/reference/llama_embed.mjs MODEL.gguf "1,2,3;4,5"');
  process.exit(2);
}
const inputs = spec.split(";").map((s) => s.split(",").map(Number));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false});
const model = await llama.loadModel({modelPath});
const context = await model.createEmbeddingContext({contextSize: 256, batchSize: 256, threads: 2});
const out = [];
for (const ids of inputs) out.push(Array.from((await context.getEmbeddingFor(ids)).vector));
console.log(JSON.stringify(out));
await context.dispose();
await model.dispose();
await llama.dispose();

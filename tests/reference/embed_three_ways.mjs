// An encoder's embeddings from the two references no one at troupe wrote: the official `openai` client
// against `troupe serve` (embeddings.create, base64 as the client sends by default and float), and
// llama.cpp (node-llama-cpp's embedding context on the same GGUF, which tokenizes each text with its own
// WPM tokenizer and puts [CLS] / [SEP] around it). Also asks the server for a completion, which an
// encoder must refuse.
//
//   node tests/reference/embed_three_ways.mjs BASE_URL MODEL_NAME MODEL.gguf TEXTS.json
//
// Prints ONE JSON object: {"openai": [[...]], "openai_float": [[...]], "llama": [[...]],
// "completion": {"status", "code", "param"}}.
import {createRequire} from "node:module";
import fs from "node:fs";
import {dirname, resolve} from "node:path";
import {fileURLToPath} from "node:url";

const [baseURL, name, modelPath, textsPath] = process.argv.slice(2);
if (!textsPath) {
  console.error("usage: node tests/reference/embed_three_ways.mjs BASE_URL MODEL_NAME MODEL.gguf TEXTS.json");
  process.exit(2);
}
const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(resolve(root, ".reference", "package.json"));
const {OpenAI} = require("openai");
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

const texts = JSON.parse(fs.readFileSync(textsPath, "utf8"));
const client = new OpenAI({baseURL, apiKey: "unused"});
const out = {};
out.openai = (await client.embeddings.create({model: name, input: texts})).data.map((d) => d.embedding);
out.openai_float = (await client.embeddings.create({model: name, input: texts, encoding_format: "float"})).data.map((d) => d.embedding);
try {
  await client.completions.create({model: name, prompt: "the world", max_tokens: 4});
  out.completion = {status: 200};
} catch (err) {
  out.completion = {status: err.status ?? null, code: err.error?.code ?? err.code ?? null, param: err.error?.param ?? err.param ?? null};
}
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false});
const model = await llama.loadModel({modelPath});
const context = await model.createEmbeddingContext({contextSize: 256, batchSize: 256, threads: 2});
out.llama = [];
for (const t of texts) out.llama.push(Array.from((await context.getEmbeddingFor(t)).vector));
console.log(JSON.stringify(out));
await context.dispose();
await model.dispose();
await llama.dispose();

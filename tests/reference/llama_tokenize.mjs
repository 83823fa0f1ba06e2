// llama.cpp's own tokenizer (node-llama-cpp 3.21.1) on a GGUF: the ids of each text, without the
// specials llama.cpp adds around a sequence (tokenize(text, false)).
//
//   node tests/reference/llama_tokenize.mjs MODEL.gguf TEXTS.json
//
// TEXTS.json is a JSON array of strings; prints ONE JSON array of id arrays.
import {createRequire} from "node:module";
import fs from "node:fs";
import path from "node:path";

const require = createRequire(path.join(process.cwd(), ".reference", "node_modules", "x.js"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

const [modelPath, textsPath] = process.argv.slice(2);
if (!modelPath || !textsPath) {
  console.error("usage: node tests/reference/llama_tokenize.mjs MODEL.gguf TEXTS.json");
  process.exit(2);
}
const texts = JSON.parse(fs.readFileSync(textsPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false});
const model = await llama.loadModel({modelPath, vocabOnly: true});
console.log(JSON.stringify(texts.map((t) => [...model.tokenize(t, false)])));
await model.dispose();
await llama.dispose();

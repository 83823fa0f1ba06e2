// llama.cpp (node-llama-cpp 3.21.1, CPU build) tokenizes a text prompt with the GGUF's own tokenizer
// (BOS first when the file asks for it) and generates STEPS greedy tokens, continuing past end-of-text.
// Prints one JSON object: {"prompt": [ids], "tokens": [ids], "gaps": [top-1 minus top-2 logprob]}.
// usage: node llama_greedy.mjs MODEL.gguf TEXT STEPS
import {greedy, openModel} from "./llama_common.mjs";

const [modelPath, text, stepsArg] = process.argv.slice(2);
const {model, sequence, close} = await openModel(modelPath);
const prompt = [...model.tokenize(text, false)];
if (model.tokens.shouldPrependBosToken && model.tokens.bos != null) prompt.unshift(model.tokens.bos);
const steps = await greedy(sequence, prompt, Number(stepsArg), 2);
const tokens = steps.map((top) => top[0][0]);
const gaps = steps.map((top) => (top.length > 1 ? top[0][1] - top[1][1] : 1e9));
process.stdout.write(JSON.stringify({prompt, tokens, gaps}) + "\n");
await close();

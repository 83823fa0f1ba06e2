// Completions from a troupe server through the official openai client, for each model name given:
// prints {name: {text, logprobs, status, code}} (greedy, 8 tokens, the prompt's top log-probabilities),
// an API error's status and code in place of text for a name the server refuses.
// PROMPT: text, or comma-separated token ids (a checkpoint without a tokenizer).
// usage: node tests/reference/openai_models.mjs BASE_URL PROMPT NAME...
import {createRequire} from "node:module";
import {dirname, resolve} from "node:path";
import {fileURLToPath} from "node:url";

const [baseURL, prompt, ...names] = process.argv.slice(2);
if (!names.length) {
  console.error("usage: node tests/reference/openai_models.mjs BASE_URL PROMPT NAME...");
  process.exit(2);
}
const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(resolve(root, ".reference", "package.json"));
const {OpenAI} = require("openai");
const client = new OpenAI({baseURL, apiKey: "unused", maxRetries: 0});
const ids = /^[0-9]+(,[0-9]+)*$/.test(prompt) ? prompt.split(",").map(Number) : null;
const out = {};
for (const model of names) {
  try {
    const r = await client.completions.create({model, prompt: ids ?? prompt, max_tokens: 8, temperature: 0, logprobs: 1});
    out[model] = {text: r.choices[0].text, logprobs: r.choices[0].logprobs?.token_logprobs ?? []};
  } catch (e) {
    out[model] = {status: e.status, code: e.code ?? e.error?.code ?? null};
  }
}
out.models = (await client.models.list()).data.map((m) => m.id);
console.log(JSON.stringify(out));

// A chat completion with an image through the official openai client: the user message is text, an
// image_url part (the file as a data URL) and text; greedy, MAX tokens, logprobs. Prints
// {content, logprobs: [each token's logprob]} or {status, message} when the server refuses; with URL
// given as the fourth argument the image part carries that URL instead of the file's data.
// usage: node tests/reference/openai_image.mjs BASE_URL MODEL IMAGE MAX [URL]
import {createRequire} from "node:module";
import {readFileSync} from "node:fs";
import {dirname, resolve} from "node:path";
import {fileURLToPath} from "node:url";

const [baseURL, model, image, max, url] = process.argv.slice(2);
if (!max) {
  console.error("usage: node tests/reference/openai_image.mjs BASE_URL MODEL IMAGE MAX [URL]");
  process.exit(2);
}
const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(resolve(root, ".reference", "package.json"));
const {OpenAI} = require("openai");
const client = new OpenAI({baseURL, apiKey: "unused", maxRetries: 0});
const data = url ?? `data:image/png;base64,${readFileSync(image).toString("base64")}`;
try {
  const r = await client.chat.completions.create({
    model,
    messages: [{role: "user", content: [{type: "text", text: "w300 w301"}, {type: "image_url", image_url: {url: data}}, {type: "text", text: " w302 w303 w304"}]}],
    max_tokens: Number(max),
    temperature: 0,
    logprobs: true,
    top_logprobs: 1,
  });
  const c = r.choices[0];
  console.log(JSON.stringify({content: c.message.content, logprobs: (c.logprobs?.content ?? []).map((t) => t.logprob), finish: c.finish_reason}));
} catch (e) {
  console.log(JSON.stringify({status: e.status ?? null, message: e.error?.message ?? String(e.message)}));
}

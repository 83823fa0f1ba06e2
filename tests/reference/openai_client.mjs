// The official `openai` npm client (pinned in tests/reference/package.json, installed by
// scripts/install-references) run against `troupe serve`, so the gateway is checked by a client no one at
// troupe wrote.
//
//   node tests/reference/openai_client.mjs --base-url http://127.0.0.1:PORT/v1 --api-key KEY --model NAME
//        [--stop STRING]
//
// Runs the scenarios below one after another and prints ONE JSON object to stdout, keyed by scenario. Each
// value is the scenario's result, or {"error": {status, message, param, code, type}} when the call threw
// (an APIError's fields and the server's error type; status is null for a connection error, or when the
// response could not be read as the scenario expects).
//   models               models.list() -> ids
//   chat                 chat completion, sampled with a seed
//   chat_stream          the same request streamed, with stream_options.include_usage
//   completion_logprobs  text completion, greedy, logprobs: 2
//   completion_ids       text completion from a prompt of token ids
//   n2                   text completion with n: 2
//   stop                 (only with --stop) greedy text completion with stop: [STRING]
//   chat_logprobs        chat completion with logprobs: true, top_logprobs: 2
//   tools                chat completion offering one function tool, tool_choice "auto"
//   embeddings           embeddings.create of two texts (base64, the client's default) and of token ids (float)
//   bad_key              models.list() with a wrong API key (expect 401)
//   invalid_param        chat completion with temperature -1 (expect 400)
//   unknown_model        text completion naming a model the server lacks (expect 404)
// Exit status: 0 when the JSON was printed (errors are data), 2 on bad usage, 1 on an unexpected crash.
import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const USAGE =
  'usage: node tests/reference/openai_client.mjs --base-url URL --api-key KEY --model NAME [--stop STRING]';

function parseArgs(argv) {
  const known = { '--base-url': 'baseURL', '--api-key': 'apiKey', '--model': 'model', '--stop': 'stop' };
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const key = known[argv[i]];
    if (!key || i + 1 >= argv.length) return null;
    out[key] = argv[++i];
  }
  if (!out.baseURL || out.apiKey === undefined || !out.model) return null;
  return out;
}

const args = parseArgs(process.argv.slice(2));
if (!args) {
  console.error(USAGE);
  process.exit(2);
}

// What a failed call reports. Anything thrown counts: an APIError carries the server's error object; a
// TypeError from reading a malformed response is the server's fault too, and is reported the same way.
function errorOf(err) {
  const body = err && typeof err.error === 'object' && err.error !== null ? err.error : undefined;
  let message = typeof body?.message === 'string' ? body.message : String(err?.message ?? err);
  const cause = err?.cause?.cause ?? err?.cause; // a connection error wraps fetch's TypeError, which wraps the socket's
  if (!body && cause) message += ` (${cause.code ?? cause.message ?? cause})`;
  return {
    error: {
      status: typeof err?.status === 'number' ? err.status : null,
      message,
      param: err?.param ?? body?.param ?? null,
      code: err?.code ?? body?.code ?? null,
      type: err?.type ?? body?.type ?? null,
    },
  };
}

async function main() {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
  const require = createRequire(resolve(root, '.reference', 'package.json'));
  const { OpenAI } = require('openai');

  const { baseURL, apiKey, model, stop } = args;
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
  const badClient = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0, timeout: 60000 });

  const chatRequest = {
    model,
    messages: [{ role: 'user', content: 'w300 w301 w302' }],
    max_tokens: 8,
    temperature: 0.8,
    seed: 5,
  };

  const scenarios = [
    ['models', async () => {
      const page = await client.models.list();
      return page.data.map((m) => m.id);
    }],
    ['chat', async () => {
      const r = await client.chat.completions.create(chatRequest);
      const c = r.choices[0];
      return { content: c.message.content, finish_reason: c.finish_reason, usage: r.usage ?? null, id: r.id,
               object: r.object };
    }],
    ['chat_stream', async () => {
      const stream = await client.chat.completions.create({
        ...chatRequest, stream: true, stream_options: { include_usage: true },
      });
      let content = '';
      let chunks = 0;
      let finishReason = null;
      let usage = null;
      let role = null;
      for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        if (!Array.isArray(chunk.choices) || chunk.choices.length === 0) continue;
        chunks++;
        for (const choice of chunk.choices) {
          const delta = choice.delta ?? {};
          if (role === null && delta.role) role = delta.role;
          if (typeof delta.content === 'string') content += delta.content;
          if (choice.finish_reason != null) finishReason = choice.finish_reason;
        }
      }
      return { content, chunks, finish_reason: finishReason, usage, role };
    }],
    ['completion_logprobs', async () => {
      const r = await client.completions.create({
        model, prompt: 'w300 w301 w302', max_tokens: 6, temperature: 0, logprobs: 2,
      });
      const c = r.choices[0];
      const lp = c.logprobs ?? null;
      return {
        text: c.text, finish_reason: c.finish_reason, usage: r.usage ?? null,
        logprobs: lp && { tokens: lp.tokens, token_logprobs: lp.token_logprobs, top_logprobs: lp.top_logprobs },
      };
    }],
    ['completion_ids', async () => {
      const r = await client.completions.create({ model, prompt: [5, 6, 7, 8], max_tokens: 5, temperature: 0 });
      const c = r.choices[0];
      return { text: c.text, finish_reason: c.finish_reason, usage: r.usage ?? null };
    }],
    ['n2', async () => {
      const r = await client.completions.create({
        model, prompt: 'w310 w311', max_tokens: 6, temperature: 1.0, seed: 7, n: 2,
      });
      const choices = [...r.choices].sort((a, b) => a.index - b.index);
      return { texts: choices.map((c) => c.text), finish_reasons: choices.map((c) => c.finish_reason) };
    }],
    ...(stop === undefined ? [] : [['stop', async () => {
      const r = await client.completions.create({
        model, prompt: 'w300 w301 w302', max_tokens: 12, temperature: 0, stop: [stop],
      });
      const c = r.choices[0];
      return { text: c.text, finish_reason: c.finish_reason };
    }]]),
    ['chat_logprobs', async () => {
      const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'w320' }], max_tokens: 4, temperature: 0,
        logprobs: true, top_logprobs: 2,
      });
      const c = r.choices[0];
      const content = c.logprobs?.content;
      return {
        content: c.message.content,
        logprobs: Array.isArray(content)
          ? content.map((t) => ({
              token: t.token, logprob: t.logprob,
              top: (t.top_logprobs ?? []).map((x) => ({ token: x.token, logprob: x.logprob })),
            }))
          : null,
      };
    }],
    ['tools', async () => {
      const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'weather in Paris?' }], max_tokens: 8, temperature: 0,
        tools: [{
          type: 'function',
          function: {
            name: 'get_weather', description: 'Get the weather',
            parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
          },
        }],
        tool_choice: 'auto',
      });
      const c = r.choices[0];
      return { content: c.message.content ?? null, tool_calls: c.message.tool_calls ?? null,
               finish_reason: c.finish_reason };
    }],
    ['embeddings', async () => {
      // The client asks for base64 by default and decodes it; the float form too.
      const r = await client.embeddings.create({ model, input: ['w300 w301', 'w302'] });
      const f = await client.embeddings.create({ model, input: [5, 6, 7], encoding_format: 'float' });
      return { vectors: r.data.map((d) => Array.from(d.embedding)), ids_vector: Array.from(f.data[0].embedding),
               prompt_tokens: r.usage.prompt_tokens, object: r.object };
    }],
    ['bad_key', async () => {
      const page = await badClient.models.list();
      return page.data.map((m) => m.id);
    }],
    ['invalid_param', async () => {
      const r = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: 'hi' }], temperature: -1,
      });
      return { content: r.choices?.[0]?.message?.content ?? null, finish_reason: r.choices?.[0]?.finish_reason };
    }],
    ['unknown_model', async () => {
      const r = await client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 2 });
      return { text: r.choices?.[0]?.text ?? null, finish_reason: r.choices?.[0]?.finish_reason };
    }],
  ];

  const results = {};
  for (const [name, run] of scenarios) {
    try {
      results[name] = await run();
    } catch (err) {
      results[name] = errorOf(err);
    }
  }
  await new Promise((done) => process.stdout.write(JSON.stringify(results) + '\n', done));
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err?.stack ?? String(err));
    process.exit(1);
  },
);

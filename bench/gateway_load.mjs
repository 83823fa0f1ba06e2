// Load on `troupe serve` through the official `openai` npm client (pinned in tests/reference/package.json,
// installed by scripts/install-references).
//
//   node bench/gateway_load.mjs --base-url URL --api-key KEY --model NAME --clients 64 --seconds 60
//        [--max-tokens 32] [--prompt-words 8]
//
// CLIENTS loops each send streaming chat completions back to back (short prompts of words w300..w499,
// temperature 0.7, a distinct seed per request) until SECONDS have passed. No request starts after that;
// requests still running get at most 30 s more, and are then aborted and counted as failed. Per request:
//   ttft     request start to the first content delta
//   tpot     (last content delta - first content delta) / (content deltas - 1), when there are >= 2 deltas
//   latency  request start to the end of the stream
// A request fails when the client throws or the stream never gives a finish_reason. Output tokens are
// the usage chunk's completion_tokens (stream_options.include_usage), or the count of content deltas when
// the server sends no usage. Prints one JSON object:
//   {clients, seconds, requests, failed, output_tokens, tokens_per_second,
//    ttft_ms: {p50, p90, p99}, tpot_ms: {p50, p90, p99}, latency_ms: {p50, p90, p99}}
// where tokens_per_second is the succeeded requests' output tokens over the wall time of the whole run,
// and percentiles (nearest rank, null when there are no samples) cover succeeded requests.
// Exit status: 0 when every request succeeded, 1 when any failed (or on a crash), 2 on bad usage.
import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const USAGE =
  'usage: node bench/gateway_load.mjs --base-url URL --api-key KEY --model NAME --clients N --seconds S ' +
  '[--max-tokens 32] [--prompt-words 8]';
const GRACE_MS = 30000;

function parseArgs(argv) {
  const known = {
    '--base-url': 'baseURL', '--api-key': 'apiKey', '--model': 'model', '--clients': 'clients',
    '--seconds': 'seconds', '--max-tokens': 'maxTokens', '--prompt-words': 'promptWords',
  };
  const out = { maxTokens: '32', promptWords: '8' };
  for (let i = 0; i < argv.length; i++) {
    const key = known[argv[i]];
    if (!key || i + 1 >= argv.length) return null;
    out[key] = argv[++i];
  }
  if (!out.baseURL || out.apiKey === undefined || !out.model || !out.clients || !out.seconds) return null;
  const clients = Number(out.clients);
  const seconds = Number(out.seconds);
  const maxTokens = Number(out.maxTokens);
  const promptWords = Number(out.promptWords);
  if (!Number.isInteger(clients) || clients < 1) return null;
  if (!Number.isFinite(seconds) || seconds <= 0) return null;
  if (!Number.isInteger(maxTokens) || maxTokens < 1) return null;
  if (!Number.isInteger(promptWords) || promptWords < 1) return null;
  return { baseURL: out.baseURL, apiKey: out.apiKey, model: out.model, clients, seconds, maxTokens, promptWords };
}

const args = parseArgs(process.argv.slice(2));
if (!args) {
  console.error(USAGE);
  process.exit(2);
}

// mulberry32: a small seeded generator, so the prompts are the same from run to run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function percentiles(samples) {
  if (samples.length === 0) return { p50: null, p90: null, p99: null };
  const s = [...samples].sort((a, b) => a - b);
  const at = (p) => s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
  const r = (x) => Math.round(x * 1000) / 1000;
  return { p50: r(at(50)), p90: r(at(90)), p99: r(at(99)) };
}

async function main() {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
  const require = createRequire(resolve(root, '.reference', 'package.json'));
  const { OpenAI } = require('openai');

  const { baseURL, apiKey, model, clients, seconds, maxTokens, promptWords } = args;
  // The client's own timeout is a backstop; the grace period below aborts stragglers first.
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: (seconds * 1000) + GRACE_MS + 60000 });

  const ttft = [];
  const tpot = [];
  const latency = [];
  let requests = 0;
  let failed = 0;
  let outputTokens = 0;
  let nextSeed = 1;
  const errorSamples = new Map(); // message -> count, reported on stderr
  const noteError = (message) => errorSamples.set(message, (errorSamples.get(message) ?? 0) + 1);
  const inFlight = new Set(); // AbortControllers of requests still running

  const now = () => performance.now();
  const t0 = now();
  const deadline = t0 + seconds * 1000;

  async function one(random) {
    const words = [];
    for (let i = 0; i < promptWords; i++) words.push(`w${300 + Math.floor(random() * 200)}`);
    const seed = nextSeed++;
    const abort = new AbortController();
    inFlight.add(abort);
    requests++;
    const start = now();
    let first = null;
    let last = null;
    let deltas = 0;
    let finishReason = null;
    let usageTokens = null;
    try {
      const stream = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: words.join(' ') }], max_tokens: maxTokens,
        temperature: 0.7, seed, stream: true, stream_options: { include_usage: true },
      }, { signal: abort.signal });
      for await (const chunk of stream) {
        if (chunk.usage && typeof chunk.usage.completion_tokens === 'number') {
          usageTokens = chunk.usage.completion_tokens;
        }
        for (const choice of chunk.choices ?? []) {
          const content = choice.delta?.content;
          if (typeof content === 'string' && content.length > 0) {
            const t = now();
            if (first === null) first = t;
            last = t;
            deltas++;
          }
          if (choice.finish_reason != null) finishReason = choice.finish_reason;
        }
      }
      const end = now();
      if (finishReason === null) { // the client ends the stream quietly when it is aborted
        failed++;
        noteError(abort.signal.aborted ? `aborted ${GRACE_MS / 1000} s after the deadline`
                                       : 'stream ended without a finish_reason');
        return;
      }
      latency.push(end - start);
      if (first !== null) ttft.push(first - start);
      if (deltas >= 2) tpot.push((last - first) / (deltas - 1));
      outputTokens += usageTokens ?? deltas;
    } catch (err) {
      failed++;
      noteError(abort.signal.aborted ? `aborted ${GRACE_MS / 1000} s after the deadline`
                                     : `${err?.constructor?.name ?? 'Error'}: ${err?.message ?? err}`);
    } finally {
      inFlight.delete(abort);
    }
  }

  async function loop(index) {
    const random = rng(0x9e3779b9 ^ (index * 7919));
    while (now() < deadline) await one(random);
  }

  const loops = Promise.all(Array.from({ length: clients }, (_, i) => loop(i)));
  // At the deadline no loop starts another request; give the running ones GRACE_MS, then abort them.
  let graceTimer;
  const grace = new Promise((done) => {
    const armed = setTimeout(() => {
      graceTimer = setTimeout(done, GRACE_MS);
    }, Math.max(0, deadline - now()));
    loops.finally(() => { clearTimeout(armed); clearTimeout(graceTimer); done(); }).catch(() => {});
  });
  await Promise.race([loops, grace]);
  if (inFlight.size > 0) {
    for (const abort of inFlight) abort.abort(); // each aborted request counts itself as failed
    let settle;
    await Promise.race([loops, new Promise((done) => { settle = setTimeout(done, 5000); })]);
    clearTimeout(settle);
    if (inFlight.size > 0) { // did not even notice the abort: count them here
      failed += inFlight.size;
      noteError(`${inFlight.size} request(s) still running after abort`);
      inFlight.clear();
    }
  }
  const wall = (now() - t0) / 1000;

  for (const [message, count] of errorSamples) console.error(`gateway_load: ${count} x ${message}`);
  const result = {
    clients, seconds, requests, failed, output_tokens: outputTokens,
    tokens_per_second: Math.round((outputTokens / wall) * 100) / 100,
    ttft_ms: percentiles(ttft), tpot_ms: percentiles(tpot), latency_ms: percentiles(latency),
  };
  await new Promise((done) => process.stdout.write(JSON.stringify(result) + '\n', done));
  return failed > 0 ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(err?.stack ?? String(err));
    process.exit(1);
  },
);

// Structured outputs through the official `openai` npm client, validated by an independent JSON Schema
// validator (ajv, pinned in tests/reference/package.json): schemas drawn at random from a seed (so the
// server never saw them), each asked as response_format json_schema (strict), streamed and not, plus
// json_object, a GBNF grammar (llama.cpp's `grammar` field) and a regex (vLLM's `guided_regex`).
//
//   node tests/reference/openai_structured.mjs --base-url http://127.0.0.1:PORT/v1 --api-key KEY --model NAME
//        [--seed N] [--count K] [--max-tokens M]
//
// Prints ONE JSON object: {"cases": [{kind, stream, schema?, content, finish_reason, valid, errors}], "failed": N}.
// A case is valid when its content parses and validates (schema), parses as an object (json_object), or
// matches the pattern (grammar, regex). Exit status: 0 when the JSON was printed, 2 on bad usage.
import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const args = {};
const argv = process.argv.slice(2);
for (let i = 0; i + 1 < argv.length; i += 2) args[argv[i].replace(/^--/, '')] = argv[i + 1];
if (!args['base-url'] || !args['api-key'] || !args.model) {
  console.error('usage: node tests/reference/openai_structured.mjs --base-url URL --api-key KEY --model NAME [--seed N] [--count K] [--max-tokens M]');
  process.exit(2);
}
const seed = Number(args.seed ?? 1);
const count = Number(args.count ?? 6);
const maxTokens = Number(args['max-tokens'] ?? 160);

// A small deterministic PRNG (mulberry32).
let state = seed >>> 0;
function rand() {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const word = () => pick(['id', 'name', 'kind', 'count', 'tags', 'ok', 'note', 'level', 'score', 'items', 'when', 'city']) + int(0, 99);

// A schema of OpenAI's strict subset, nested at most `depth` deep; strings bounded so answers stay short.
function schemaOf(depth) {
  const leaf = [
    () => ({ type: 'string', maxLength: int(0, 12) }),
    () => ({ type: 'string', enum: [word(), word(), 'é ü ☃'] }),
    () => ({ type: 'string', pattern: '^[A-Z][a-z]{1,4}-[0-9]{2}$' }),
    () => ({ type: 'string', format: pick(['date', 'uuid']) }),
    () => { const lo = int(-50, 50); return { type: 'integer', minimum: lo, maximum: lo + int(0, 300) }; },
    () => ({ type: 'integer', exclusiveMinimum: 0, maximum: 9 }),
    () => ({ type: 'number', minimum: -1.5, maximum: 2.25 }),
    () => ({ type: 'boolean' }),
    () => ({ type: ['integer', 'null'] }),
    () => ({ const: pick(['fixed', 7, true, null]) }),
  ];
  const nested = [
    () => ({ type: 'array', items: schemaOf(depth - 1), minItems: int(0, 1), maxItems: int(1, 3) }),
    () => objectOf(depth - 1),
    () => ({ anyOf: [schemaOf(depth - 1), { type: 'null' }] }),
  ];
  return depth > 0 && rand() < 0.4 ? pick(nested)() : pick(leaf)();
}
function objectOf(depth) {
  const n = int(1, 4);
  const properties = {};
  for (let i = 0; i < n; i++) properties[word()] = schemaOf(depth);
  const keys = Object.keys(properties);
  const required = keys.filter(() => rand() < 0.75);
  return { type: 'object', properties, required, additionalProperties: false };
}
function rootSchema(i) {
  if (i % 3 === 2) {
    // Recursion through $defs: a tree of bounded fan-out.
    return {
      type: 'object',
      properties: { label: { type: 'string', maxLength: 6 }, node: { $ref: '#/$defs/node' } },
      required: ['label', 'node'],
      additionalProperties: false,
      $defs: {
        node: {
          type: 'object',
          properties: { v: { type: 'integer', minimum: 0, maximum: 99 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } },
          required: ['v'],
          additionalProperties: false,
        },
      },
    };
  }
  return objectOf(2);
}

function errorOf(err) {
  const body = err && typeof err.error === 'object' && err.error !== null ? err.error : undefined;
  return { status: typeof err?.status === 'number' ? err.status : null, message: body?.message ?? String(err?.message ?? err) };
}

async function main() {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
  const require = createRequire(resolve(root, '.reference', 'package.json'));
  const { OpenAI } = require('openai');
  const Ajv2020 = require('ajv/dist/2020').default;
  const addFormats = require('ajv-formats').default;
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  const client = new OpenAI({ baseURL: args['base-url'], apiKey: args['api-key'], maxRetries: 0, timeout: 120000 });

  async function ask(body, stream) {
    if (!stream) {
      const r = await client.chat.completions.create({ ...body, stream: false });
      return { content: r.choices[0].message.content ?? '', finish_reason: r.choices[0].finish_reason };
    }
    const s = await client.chat.completions.create({ ...body, stream: true });
    let content = '';
    let finish = null;
    for await (const chunk of s) {
      const c = chunk.choices[0];
      if (!c) continue;
      if (c.delta?.content) content += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
    return { content, finish_reason: finish };
  }

  const cases = [];
  const base = (i) => ({ model: args.model, max_tokens: maxTokens, temperature: 1.0, seed: seed * 1000 + i,
                        messages: [{ role: 'user', content: 'w300 w301 answer in JSON' }] });
  for (let i = 0; i < count; i++) {
    const schema = rootSchema(i);
    const stream = i % 2 === 1;
    const c = { kind: 'json_schema', stream, schema };
    try {
      const r = await ask({ ...base(i), response_format: { type: 'json_schema', json_schema: { name: `s${i}`, strict: true, schema } } }, stream);
      Object.assign(c, r);
      let value;
      try { value = JSON.parse(r.content); } catch (e) { c.valid = false; c.errors = `does not parse: ${e.message}`; }
      if (c.valid !== false) {
        const validate = ajv.compile(schema);
        c.valid = validate(value);
        if (!c.valid) c.errors = ajv.errorsText(validate.errors);
      }
    } catch (err) {
      c.valid = false;
      c.errors = errorOf(err);
    }
    cases.push(c);
  }
  const others = [
    { kind: 'json_object', extra: { response_format: { type: 'json_object' } }, check: (t) => { const v = JSON.parse(t); return v !== null && typeof v === 'object' && !Array.isArray(v); } },
    { kind: 'grammar', extra: { grammar: 'root ::= ("yes" | "no") ", because " [a-z ]{3,20} "."' }, check: (t) => /^(yes|no), because [a-z ]{3,20}\.$/.test(t) },
    { kind: 'regex', extra: { guided_regex: '[0-9]{3}-[A-Z]{2}( ok)?' }, check: (t) => /^[0-9]{3}-[A-Z]{2}( ok)?$/.test(t) },
  ];
  for (const [k, o] of others.entries()) {
    for (const stream of [false, true]) {
      const c = { kind: o.kind, stream };
      try {
        const r = await ask({ ...base(100 + 2 * k + (stream ? 1 : 0)), ...o.extra }, stream);
        Object.assign(c, r);
        try { c.valid = o.check(r.content); } catch (e) { c.valid = false; c.errors = e.message; }
      } catch (err) {
        c.valid = false;
        c.errors = errorOf(err);
      }
      cases.push(c);
    }
  }
  console.log(JSON.stringify({ cases, failed: cases.filter((c) => !c.valid).length }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});

// The reference side of bench/tokenize_bench: Hugging Face's tokenizers (pinned in
// tests/reference/package.json, installed by scripts/install-references) encoding the same documents.
//
//   node bench/tokenize_bench.mjs TOKENIZER_JSON DOCS_JSONL REPEATS
//
// Prints one JSON object: the document bytes, and MB/s (10^6 bytes per second, best of REPEATS) for
//   sequential  one `await tok.encode(doc)` after another (one thread of Rust work at a time)
//   batch       `await tok.encodeBatch(docs)` (Rust's rayon pool, all cores)
// both with addSpecialTokens = false.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(resolve(root, '.reference', 'package.json'));
const { Tokenizer } = require('tokenizers');

const [tokenizerPath, docsPath, repeatsArg] = process.argv.slice(2);
const repeats = Number(repeatsArg ?? 3);
const tok = Tokenizer.fromFile(tokenizerPath);
const docs = readFileSync(docsPath, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, 'utf8'), 0);

const time = async (f) => {
  let best = Infinity;
  for (let r = 0; r < repeats; r++) {
    const t0 = process.hrtime.bigint();
    await f();
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  return bytes / 1e6 / best;
};

let tokens = 0;
const sequential = await time(async () => {
  tokens = 0;
  for (const d of docs) tokens += (await tok.encode(d, null, { addSpecialTokens: false })).getIds().length;
});
const batch = await time(async () => {
  await tok.encodeBatch(docs, { addSpecialTokens: false });
});
console.log(JSON.stringify({ bytes, tokens, sequential_mb_s: sequential, batch_mb_s: batch }));

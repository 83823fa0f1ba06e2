// The reference side of the tokenizer parity tests: Hugging Face's tokenizers (the Rust library through
// its Node binding, pinned in package.json) run over a corpus.
//
//   node tests/reference/tokenize.mjs TOKENIZER_JSON CORPUS_JSONL OUT_JSONL
//
// CORPUS_JSONL holds one JSON string per line. OUT_JSONL gets one JSON object per line, in order:
//   ids         encode(text, add_special_tokens = true)
//   plain       encode(text, add_special_tokens = false)
//   text        decode(plain, skip_special_tokens = false)
//   text_skip   decode(ids, skip_special_tokens = true)
import { createRequire } from 'node:module';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const require = createRequire(resolve(root, '.reference', 'package.json'));
const { Tokenizer } = require('tokenizers');

const [tokenizerPath, corpusPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error('usage: node tests/reference/tokenize.mjs TOKENIZER_JSON CORPUS_JSONL OUT_JSONL');
  process.exit(2);
}

const tok = Tokenizer.fromFile(tokenizerPath);
const texts = readFileSync(corpusPath, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));

const batch = 256;
const lines = [];
for (let start = 0; start < texts.length; start += batch) {
  const chunk = texts.slice(start, start + batch);
  const withSpecial = await tok.encodeBatch(chunk, { addSpecialTokens: true });
  const plain = await tok.encodeBatch(chunk, { addSpecialTokens: false });
  const ids = withSpecial.map((e) => e.getIds());
  const plainIds = plain.map((e) => e.getIds());
  const text = await tok.decodeBatch(plainIds, false);
  const textSkip = await tok.decodeBatch(ids, true);
  for (let i = 0; i < chunk.length; i++) {
    lines.push(JSON.stringify({ ids: ids[i], plain: plainIds[i], text: text[i], text_skip: textSkip[i] }));
  }
}
writeFileSync(outPath, lines.join('\n') + '\n');

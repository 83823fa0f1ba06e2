#!/usr/bin/env bash
# An encoder-only model end to end (BERT and nomic-bert fixtures, GGUF and HF forms): `troupe embed`, the
# served /v1/embeddings through the official openai client (base64 and float), and llama.cpp's own
# embeddings of the same texts on the same GGUF (its tokenizer, its [CLS]/[SEP], its mean pooling) all
# agree (cosine > 0.9999); the HF directory (sentence-transformers modules.json, mean pooling,
# normalized) embeds as its GGUF does; a completion asked of the encoder is a 400 naming the model.
set -euo pipefail
# shellcheck source=tests/apps/lib/serve.sh
source "$(dirname "$0")/lib/serve.sh"
troupe="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
texts='["the world is good", "Hello, World! It is 42.", "playing runs: walked (talked) back", "qzx unknownword years"]'
echo "$texts" > "$tmp/texts.json"
for family in bert nomic_bert; do
  "$troupe" fixture --family "$family" --gguf --out "$tmp/$family.gguf" > /dev/null
  "$troupe" fixture --family "$family" --out "$tmp/$family-hf" > /dev/null
  args=()
  while IFS= read -r t; do args+=(--input "$t"); done < <(python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))))' "$tmp/texts.json")
  "$troupe" embed --model "$tmp/$family.gguf" "${args[@]}" > "$tmp/$family-cli.json"
  "$troupe" embed --model "$tmp/$family-hf" "${args[@]}" > "$tmp/$family-cli-hf.json"
  start_serve "$troupe" "$tmp" --model "$tmp/$family.gguf"
  (cd "$root" && node tests/reference/embed_three_ways.mjs "$base/v1" "$family" "$tmp/$family.gguf" "$tmp/texts.json") > "$tmp/$family-ref.json"
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
  python3 - "$tmp" "$family" <<'PY'
import json, math, sys
tmp, family = sys.argv[1], sys.argv[2]
cli = json.load(open(f"{tmp}/{family}-cli.json"))
hf = json.load(open(f"{tmp}/{family}-cli-hf.json"))
ref = json.load(open(f"{tmp}/{family}-ref.json"))
cos = lambda a, b: sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
assert cli["pooling"] == "mean" and cli["declared_by"] == "gguf pooling_type", cli["pooling"]
assert hf["pooling"] == "mean" and hf["declared_by"] == "sentence-transformers" and hf["normalize"], hf["declared_by"]
worst = 1.0
for i in range(len(ref["llama"])):
    mine = cli["data"][i]["embedding"]
    for other in (ref["openai"][i], ref["openai_float"][i], ref["llama"][i], hf["data"][i]["embedding"]):
        assert len(other) == len(mine), (len(other), len(mine))
        c = cos(mine, other)
        worst = min(worst, c)
        assert c > 0.9999, (family, i, c)
c = ref["completion"]
assert c["status"] == 400 and c["code"] == "program_not_offered" and c["param"] == "model", c
print(f"{family}: {len(ref['llama'])} texts, 1 - worst cosine {1 - worst:.1e} (troupe embed, openai base64/float, llama.cpp, HF form)")
PY
done
echo "encoder embeddings: ok"

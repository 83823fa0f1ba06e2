#!/usr/bin/env bash
# GGUF LoRA against llama.cpp: `troupe fixture --lora-to-gguf` writes a PEFT adapter in llama.cpp's
# GGUF LoRA form (convert_lora_to_gguf's layout: lora_b's Q/K rows permuted as the llama base's);
# `troupe generate --adapter` on the GGUF base gives llama.cpp's (node-llama-cpp 3.21.1, the adapter
# at scale 1) greedy tokens and top-5 log-probabilities within 2e-3, f32 caches on both sides, for llama
# (permuted Q/K) and qwen2; and the same tokens as the PEFT adapter over the Hugging Face form.
set -euo pipefail
troupe="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$root"
ids="[3,50,70,90,110,130,150,170]"
for family in llama qwen2; do
  dims=512,128,256,2,4,2,32
  "$troupe" fixture --family "$family" --out "$tmp/$family-hf" --dims "$dims" > /dev/null
  "$troupe" fixture --family "$family" --gguf --out "$tmp/$family.gguf" --dims "$dims" > /dev/null
  "$troupe" fixture --family "$family" --lora-over "$tmp/$family-hf" --lora-rank 8 --seed 4 --out "$tmp/$family-ad" > /dev/null
  "$troupe" fixture --family "$family" --lora-to-gguf "$tmp/$family-ad" --gguf-base "$tmp/$family.gguf" --out "$tmp/$family-lora.gguf" > /dev/null
  gen() { "$troupe" generate --prompt-ids "${ids:1:${#ids}-2}" --max-tokens 16 --logprobs 5 --kv-type f32 --json "$@" 2>/dev/null; }
  gen --model "$tmp/$family.gguf" --adapter "$tmp/$family-lora.gguf" > "$tmp/troupe.json"
  gen --model "$tmp/$family-hf" --adapter "$tmp/$family-ad" > "$tmp/troupe-hf.json"
  gen --model "$tmp/$family.gguf" > "$tmp/base.json"
  TROUPE_LORA="$tmp/$family-lora.gguf" node tests/reference/llama_logprobs.mjs "$tmp/$family.gguf" "$ids" 16 5 > "$tmp/llama.jsonl"
  python3 - "$tmp" "$family" <<'PY'
import json, sys
tmp, family = sys.argv[1], sys.argv[2]
mine = json.load(open(f"{tmp}/troupe.json"))
hf = json.load(open(f"{tmp}/troupe-hf.json"))
base = json.load(open(f"{tmp}/base.json"))
ref = [json.loads(l) for l in open(f"{tmp}/llama.jsonl")]
# The GGUF form may end at its end-of-generation id where the HF form (other eos ids) goes on.
n = min(len(mine["tokens"]), len(hf["tokens"]))
assert n >= 8 and mine["tokens"][:n] == hf["tokens"][:n], (family, mine["tokens"], hf["tokens"])
assert mine["tokens"] != base["tokens"], (family, "the adapter changed nothing")
worst = 0.0
for i, (tok, r) in enumerate(zip(mine["tokens"], ref)):
    assert tok == r["token"], (family, i, tok, r["token"])
    theirs = {t[0]: t[1] for t in r["top"]}
    for t in mine["logprobs"][i]:
        if t["id"] in theirs:
            worst = max(worst, abs(t["logprob"] - theirs[t["id"]]))
assert worst <= 2e-3, (family, worst)
print(f"lora_gguf_parity {family}: {len(mine['tokens'])}/{len(mine['tokens'])} greedy tokens as llama.cpp's, worst top-5 |dlogprob| {worst:.1e}")
PY
done
echo "lora_gguf_parity: ok"

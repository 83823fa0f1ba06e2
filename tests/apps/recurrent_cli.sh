#!/usr/bin/env bash
# The recurrent families from the command line: `troupe fixture --ssm` sizes them; `generate` on 2
# tensor-parallel ranks gives one device's tokens and log-probabilities (to 1e-4) for mamba2, nemotron_h
# and qwen3_next, greedy and sampled; `bench` reports the state each sequence carries (mamba2: 2 layers
# x (conv window 3 x (256 + 2 x 2 x 32) + scan state 8 heads x 32 x 32) floats = 74,752 bytes) next to
# the KV bytes; `plan` sizes the hybrid (KV of its one attention layer of two averaged per layer:
# 2 x 2 heads x 32 x 2 (the default f16 cache) / 2 = 128 bytes; scratch 1,867,776 bytes plus 16 rows of 5,632 bytes of conv and
# delta-rule state) and refuses mamba2, which has no KV to size; a fifth --ssm value and a group count
# that does not split are refused by name.
set -euo pipefail
troupe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$troupe" fixture --family mamba2 --gguf --out "$tmp/m.gguf" --dims 512,128,256,2,4,2,32 --ssm 32,2,4,2 > /dev/null
"$troupe" fixture --family nemotron_h --gguf --out "$tmp/n.gguf" --dims 512,128,256,4,4,2,32 --ssm 16,2 > /dev/null
"$troupe" fixture --family qwen3_next --out "$tmp/q" --dims 512,128,256,2,4,2,32 --ssm 16,2,4,2 --experts 4,2,64,64 > /dev/null
run() { "$troupe" generate --prompt-ids 3,50,70,90,110,130 --max-tokens 16 --logprobs 1 --json "$@" 2>&1; }
same() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
for x, y in zip(a["logprobs"], b["logprobs"]):
    assert abs(x[0]["logprob"] - y[0]["logprob"]) < 1e-4, (x, y)
PY
}
for model in "$tmp/m.gguf" "$tmp/n.gguf" "$tmp/q"; do
  for args in "--temperature 0" "--temperature 0.8 --seed 5"; do
    # shellcheck disable=SC2086
    one="$(run --model "$model" $args)"
    # shellcheck disable=SC2086
    two="$(run --model "$model" $args --tensor-parallel 2)"
    same "$one" "$two" || { echo "$model ($args): $two != $one"; exit 1; }
  done
done
out="$("$troupe" bench --model "$tmp/m.gguf" --prompt-len 16 --gen 4 --runs 1 2>&1)"
grep -q "KV (f16) 0 bytes per token, recurrent 74752 bytes" <<< "$out" || { echo "$out"; exit 1; }
err="$tmp/err"
plan="$("$troupe" plan --model "$tmp/q" --node a=cpu:1GiB --json)"
python3 - "$plan" <<'PY'
import json, sys
r = json.loads(sys.argv[1])["requirements"]
assert r["kv_bytes_per_token_per_layer"] == 128, r  # at the default f16 cache
assert r["scratch_bytes"] == 1867776 + 16 * 5632, r
PY
if "$troupe" plan --model "$tmp/m.gguf" --node a=cpu:1GiB 2> "$err"; then echo "mamba2 planned"; exit 1; fi
grep -q "has no attention layer" "$err" || { cat "$err"; exit 1; }
if "$troupe" fixture --family mamba2 --gguf --out "$tmp/x.gguf" --ssm 16,1,4,2,9 2> "$err"; then echo "five --ssm values accepted"; exit 1; fi
grep -q "at most 4 values" "$err" || { cat "$err"; exit 1; }
# One B/C group (as released Mamba2 checkpoints): every rank holds it and the gated norm's sum of squares
# is all-reduced, so 2 ranks give one device's tokens. Two groups over 4 ranks would need the norm
# reduced over a subgroup: refused by name.
"$troupe" fixture --family mamba2 --gguf --out "$tmp/one.gguf" --dims 512,128,256,2,4,2,32 --ssm 16,1 > /dev/null
one=$("$troupe" generate --model "$tmp/one.gguf" --prompt-ids 3,4,5,6 --max-tokens 12 --temperature 0 --backend cpu 2>/dev/null | tail -n 1)
two=$("$troupe" generate --model "$tmp/one.gguf" --prompt-ids 3,4,5,6 --max-tokens 12 --temperature 0 --tensor-parallel 2 2>/dev/null | tail -n 1)
[ -n "$one" ] && [ "$one" = "$two" ] || { echo "one group: 2 ranks gave '$two', one device '$one'"; exit 1; }
"$troupe" fixture --family mamba2 --gguf --out "$tmp/two.gguf" --dims 512,128,256,2,4,2,32 --ssm 16,2 > /dev/null
if "$troupe" generate --model "$tmp/two.gguf" --prompt-ids 3,4 --tensor-parallel 4 2> "$err"; then echo "two norm groups split 4 ways"; exit 1; fi
grep -q "gated norm spans 2 groups" "$err" || { cat "$err"; exit 1; }
echo ok

#!/usr/bin/env bash
# `troupe generate --expert-parallel N` on routed fixtures (qwen3_moe with 8 experts, 2 per token, and
# deepseek_v3 with latent attention and group routing): 2 and 4 simulated devices holding whole experts,
# alone and with --pipeline-parallel 2, give the tokens and log-probabilities (to 1e-4) one device
# gives, greedy and sampled; then a dense model, experts that do not split, and a mismatched
# --tensor-parallel are refused by name.
set -euo pipefail
troupe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$troupe" fixture --family qwen3_moe --gguf --out "$tmp/q.gguf" --experts 8,2,128 > /dev/null
"$troupe" fixture --family deepseek_v3 --out "$tmp/ds" > /dev/null
run() { "$troupe" generate --prompt-ids 3,50,70,90,110,130 --max-tokens 24 --logprobs 1 --json "$@" 2>&1; }
same() {  # tokens equal, log-probabilities within 1e-4
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
for x, y in zip(a["logprobs"], b["logprobs"]):
    assert abs(x[0]["logprob"] - y[0]["logprob"]) < 1e-4, (x, y)
PY
}
for model in "$tmp/q.gguf" "$tmp/ds"; do
  for args in "--temperature 0" "--temperature 0.8 --seed 5"; do
    # shellcheck disable=SC2086
    one="$(run --model "$model" $args)"
    for split in "--expert-parallel 2" "--expert-parallel 4" "--expert-parallel 2 --pipeline-parallel 2" "--expert-parallel 2 --tensor-parallel 2"; do
      # shellcheck disable=SC2086
      got="$(run --model "$model" $args $split)"
      same "$one" "$got" || { echo "$model $split ($args): $got != $one"; exit 1; }
    done
  done
done
err="$tmp/err"
if "$troupe" generate --prompt x --expert-parallel 2 2> "$err"; then echo "a dense model was split by experts"; exit 1; fi
grep -q "no routed experts" "$err" || { cat "$err"; exit 1; }
if "$troupe" generate --model "$tmp/q.gguf" --prompt-ids 3,4 --expert-parallel 3 2> "$err"; then echo "8 experts split 3 ways"; exit 1; fi
grep -q "do not split 3 ways\|does not split 3 ways" "$err" || { cat "$err"; exit 1; }
if "$troupe" generate --model "$tmp/q.gguf" --prompt-ids 3,4 --expert-parallel 2 --tensor-parallel 4 2> "$err"; then echo "ep 2 x tp 4 accepted"; exit 1; fi
grep -q "spans the tensor-parallel group" "$err" || { cat "$err"; exit 1; }
# The planner with whole experts: 8 experts over 4 ranks, and a deploy line that asks for that split.
j="$("$troupe" plan --model "$tmp/q.gguf" --node a=cpu:64MiB*4 --expert-parallel --json 2>/dev/null)"
echo "$j" | grep -q '"experts":8' || { echo "plan: $j"; exit 1; }
echo "$j" | grep -q -- '--expert-parallel 4' || { echo "plan deploy line: $j"; exit 1; }
echo "expert parallel: ok"

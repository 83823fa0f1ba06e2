#!/usr/bin/env bash
# LoRA adapters from the command line: `troupe fixture --lora-over` writes a PEFT adapter over a Hugging
# Face fixture and `--merged-with` the same checkpoint with it merged; `generate --adapter` on the base
# gives the merged checkpoint's tokens and log-probabilities (to 2e-4), greedy and sampled, and differs
# from the base, also with prompt-lookup speculation and chained decode; an adapter of another model's
# shapes and a malformed one are refused with exit 2.
set -euo pipefail
troupe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$troupe" fixture --family llama --out "$tmp/base" --dims 512,128,256,2,4,2,32 > /dev/null
"$troupe" fixture --family llama --lora-over "$tmp/base" --lora-rank 8 --seed 5 --out "$tmp/ad" > /dev/null
"$troupe" fixture --family llama --lora-over "$tmp/base" --merged-with "$tmp/ad" --out "$tmp/merged" > /dev/null
run() { "$troupe" generate --prompt-ids 3,50,70,90,110,130 --max-tokens 12 --logprobs 1 --json "$@" 2>/dev/null; }
compare() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b, want = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
same = a["tokens"] == b["tokens"] and all(abs(x[0]["logprob"] - y[0]["logprob"]) <= 2e-4 for x, y in zip(a["logprobs"], b["logprobs"]))
if (want == "same") != same:
    sys.exit(f"expected {want}: {a['tokens']} vs {b['tokens']}")
PY
}
for sampling in "" "--temperature 0.9 --seed 11"; do
  adapted="$(run --model "$tmp/base" --adapter "$tmp/ad" $sampling)"
  compare "$adapted" "$(run --model "$tmp/merged" $sampling)" same
  compare "$adapted" "$(run --model "$tmp/base" $sampling)" different
  # Speculation (verify windows run the adapter) and chained decode keep the adapted output.
  compare "$adapted" "$(run --model "$tmp/base" --adapter "$tmp/ad" --speculative ngram $sampling)" same
  compare "$adapted" "$(run --model "$tmp/base" --adapter "$tmp/ad" --chain 4 $sampling)" same
done
"$troupe" fixture --family llama --out "$tmp/wide" --dims 512,192,256,2,4,2,48 > /dev/null
"$troupe" fixture --family llama --lora-over "$tmp/wide" --out "$tmp/wide-ad" > /dev/null
set +e
err="$("$troupe" generate --model "$tmp/base" --adapter "$tmp/wide-ad" --prompt-ids 3,4 --max-tokens 2 2>&1)"; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "bad_adapter\|do not fit" <<<"$err" || { echo "a mis-shaped adapter: rc $rc, $err"; exit 1; }
echo '{"r": 4, "use_dora": true}' > "$tmp/ad/adapter_config.json"
set +e
err="$("$troupe" generate --model "$tmp/base" --adapter "$tmp/ad" --prompt-ids 3,4 --max-tokens 2 2>&1)"; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "use_dora" <<<"$err" || { echo "a DoRA config: rc $rc, $err"; exit 1; }
echo "lora_cli: ok"

#!/usr/bin/env bash
# The KV cache type from the command line (docs/kv-cache.md): `bench --kv-type` reports the type, the
# bytes a token takes (2 layers x 2 x 2 KV heads x 64 values: f32 2048, f16/bf16 1024, q8_0 544) and
# the sequences of the run's length that fit in 1 GiB; `generate` runs with every type on the CPU
# executor and the oracle, the two agreeing token for token (both round the cache the same way), and
# f16 (the default) gives the f32 cache's greedy tokens on this model; q8_0 on a model whose head rows
# are not whole 32-value blocks, and an unknown type, are refused by name.
set -euo pipefail
troupe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$troupe" fixture --family llama --gguf --out "$tmp/m.gguf" --dims 512,256,512,2,4,2,64 > /dev/null
"$troupe" fixture --family llama --gguf --out "$tmp/d16.gguf" --dims 512,64,96,2,4,2,16 > /dev/null
for pair in f32:2048 f16:1024 bf16:1024 q8_0:544; do
  t="${pair%%:*}" bytes="${pair##*:}"
  out="$("$troupe" bench --model "$tmp/m.gguf" --prompt-len 24 --gen 8 --runs 1 --kv-type "$t" --json)"
  python3 - "$out" "$t" "$bytes" <<'PY'
import json, sys
r, t, b = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
assert r["kv_type"] == t, r
assert r["kv_bytes_per_token"] == b, r
assert r["sequences_per_gib"] == (1 << 30) // (b * 32), r
PY
done
gen() { "$troupe" generate --model "$tmp/m.gguf" --prompt-ids 3,50,70,90,110,130,150,170 --max-tokens 12 --json "$@" 2>&1; }
tokens() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$1"; }
f32="$(tokens "$(gen --kv-type f32)")"
default="$(tokens "$(gen)")"
[ "$default" = "$f32" ] || { echo "f16 cache: $default, f32 cache: $f32"; exit 1; }
for t in f16 bf16 q8_0; do
  cpu="$(tokens "$(gen --kv-type "$t")")"
  oracle="$(tokens "$(gen --kv-type "$t" --backend oracle)")"
  [ "$cpu" = "$oracle" ] || { echo "$t: cpu $cpu, oracle $oracle"; exit 1; }
done
err="$tmp/err"
if "$troupe" generate --model "$tmp/d16.gguf" --prompt-ids 3,4 --max-tokens 2 --kv-type q8_0 2> "$err"; then echo "q8_0 over 16-wide heads accepted"; exit 1; fi
grep -q "whole 32-value blocks" "$err" || { cat "$err"; exit 1; }
if "$troupe" bench --model "$tmp/m.gguf" --kv-type q4_0 2> "$err"; then echo "q4_0 accepted"; exit 1; fi
grep -q "q4_0" "$err" || { cat "$err"; exit 1; }
echo "kv cache cli: ok"

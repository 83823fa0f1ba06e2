#!/usr/bin/env bash
# The CUDA backend from the command line. Without a usable device (or in a build without CUDA) every
# cuda command refuses with exit 2 and says why; with one, generate on cuda writes the cpu backend's
# greedy tokens for the embedded model and bench prints its figures.
set -euo pipefail
troupe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
head -c 32 /dev/urandom | base64 > "$tmp/secret"

if "$troupe" generate --backend cuda --prompt "And God said" --max-tokens 1 --json > "$tmp/probe" 2> "$tmp/probe.err"; then
  cpu="$("$troupe" generate --prompt "And God said" --max-tokens 24 --json 2>/dev/null)"
  gpu="$("$troupe" generate --backend cuda --prompt "And God said" --max-tokens 24 --json 2>/dev/null)"
  [ "$cpu" = "$gpu" ] || { echo "cuda tokens differ from cpu:"; echo "$cpu"; echo "$gpu"; exit 1; }
  "$troupe" bench --backend cuda --model "$(dirname "$troupe")/../share/troupe/models/troupe-kjv.gguf" --prompt-len 64 --gen 32 \
    --batch 4 --runs 1 | grep -q "decode_tok_s"
  echo "cuda: generate equals cpu, bench ran"
  exit 0
fi
# No device: each cuda command refuses by name with exit 2.
grep -q "cuda" "$tmp/probe.err" || { echo "generate --backend cuda failed without naming why:"; cat "$tmp/probe.err"; exit 1; }
set +e
"$troupe" generate --backend cuda --prompt "x" --max-tokens 1 >/dev/null 2>&1; rc1=$?
"$troupe" bench --backend cuda --model /nonexistent.gguf >/dev/null 2>&1; rc2=$?
"$troupe" node --join 127.0.0.1:9 --insecure --secret-file "$tmp/secret" --devices cuda:0 > /dev/null 2> "$tmp/node.err"; rc3=$?
"$troupe" node --join 127.0.0.1:9 --insecure --secret-file "$tmp/secret" --devices tpu:0 > /dev/null 2> "$tmp/node2.err"; rc4=$?
"$troupe" generate --backend cuda --tensor-parallel 2 --prompt "x" > /dev/null 2> "$tmp/tp.err"; rc5=$?
set -e
for rc in $rc1 $rc2 $rc3 $rc4 $rc5; do [ "$rc" = 2 ] || { echo "expected exit 2, got $rc1 $rc2 $rc3 $rc4 $rc5"; exit 1; }; done
grep -q "cuda:0" "$tmp/node.err" || { cat "$tmp/node.err"; exit 1; }
grep -q "cpu:0 or cuda:N" "$tmp/node2.err" || { cat "$tmp/node2.err"; exit 1; }
grep -q "cpu backend" "$tmp/tp.err" || { cat "$tmp/tp.err"; exit 1; }
echo "no device: every cuda command refused with the reason: $(grep -m1 "cuda backend" "$tmp/probe.err" | cut -c1-200)"

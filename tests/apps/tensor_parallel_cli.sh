#!/usr/bin/env bash
# `troupe generate --tensor-parallel N --pipeline-parallel M` on the embedded model (4 layers, 4 query
# heads, 2 key/value heads): 2 and 4 simulated devices, 2 and 4 stages and 2 x 2 give the tokens one
# device gives, greedy and sampled, on the CPU executor (tensor parallel also on the oracle); splits that
# cannot be made are refused by name.
set -euo pipefail
troupe="$1"
tokens() { "$troupe" generate --prompt "And God said" --max-tokens 48 --json "$@" 2>/dev/null | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/'; }
for args in "--temperature 0" "--temperature 0.8 --seed 5"; do
  # shellcheck disable=SC2086
  one="$(tokens $args)"
  [ -n "$one" ] || { echo "no tokens from one device"; exit 1; }
  for n in 2 4; do
    # shellcheck disable=SC2086
    got="$(tokens $args --tensor-parallel $n)"
    [ "$got" = "$one" ] || { echo "tp $n ($args): $got != $one"; exit 1; }
  done
  for split in "--pipeline-parallel 2" "--pipeline-parallel 4" "--tensor-parallel 2 --pipeline-parallel 2"; do
    # shellcheck disable=SC2086
    got="$(tokens $args $split)"
    [ "$got" = "$one" ] || { echo "$split ($args): $got != $one"; exit 1; }
  done
  # shellcheck disable=SC2086
  got="$(tokens $args --tensor-parallel 2 --backend oracle)"
  [ "$got" = "$one" ] || { echo "oracle tp 2 ($args): $got != $one"; exit 1; }
done
if "$troupe" generate --prompt x --tensor-parallel 3 2>"${TMPDIR:-/tmp}/tp3.$$"; then echo "tp 3 was accepted"; exit 1; fi
grep -q "do not split 3 ways" "${TMPDIR:-/tmp}/tp3.$$" || { cat "${TMPDIR:-/tmp}/tp3.$$"; exit 1; }
if "$troupe" generate --prompt x --pipeline-parallel 5 2>"${TMPDIR:-/tmp}/tp3.$$"; then echo "pp 5 was accepted"; exit 1; fi
grep -q "4 layers do not make 5 stages" "${TMPDIR:-/tmp}/tp3.$$" || { cat "${TMPDIR:-/tmp}/tp3.$$"; exit 1; }
rm -f "${TMPDIR:-/tmp}/tp3.$$"
# The split-replica bench runs one sequence on 1 x 1 and on 2 x 2 through the driver and says so.
model="$(dirname "$troupe")/../share/troupe/models/troupe-kjv.gguf"
j="$("$troupe" bench --model "$model" --prompt-len 8 --gen 4 --runs 1 --tensor-parallel 2 --pipeline-parallel 2 --json)"
echo "$j" | grep -q '"pipeline_parallel":2' || { echo "bench --pipeline-parallel: $j"; exit 1; }
echo "parallel generate: 2 and 4 ranks, 2 and 4 stages and 2 x 2 equal one device"

#!/usr/bin/env bash
# `troupe generate --tensor-parallel N` on the embedded model (4 query heads, 2 key/value heads): 2 and 4
# simulated devices give the tokens one device gives, greedy and sampled, on the CPU executor and the
# oracle; a split that does not divide is refused by name.
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
  # shellcheck disable=SC2086
  got="$(tokens $args --tensor-parallel 2 --backend oracle)"
  [ "$got" = "$one" ] || { echo "oracle tp 2 ($args): $got != $one"; exit 1; }
done
if "$troupe" generate --prompt x --tensor-parallel 3 2>"${TMPDIR:-/tmp}/tp3.$$"; then echo "tp 3 was accepted"; exit 1; fi
grep -q "do not split 3 ways" "${TMPDIR:-/tmp}/tp3.$$" || { cat "${TMPDIR:-/tmp}/tp3.$$"; exit 1; }
rm -f "${TMPDIR:-/tmp}/tp3.$$"
echo "tensor-parallel generate: 2 and 4 ranks equal one device"

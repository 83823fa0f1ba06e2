#!/usr/bin/env bash
# `troupe chat` reading turns from a pipe: each answer streams and ends with a newline, /reset starts a
# new conversation (the same first turn then gets the same greedy answer), the conversation is kept (a
# turn after another gets another answer than alone), /system and /exit work, exit status 0.
set -euo pipefail
troupe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$troupe" fixture --family llama --gguf --out "$tmp/m.gguf" > /dev/null
chat() { "$troupe" chat --model "$tmp/m.gguf" --max-tokens 12 --temperature 0 2>>"$tmp/err"; }
printf 'w300 w301\n' | chat > "$tmp/one"
printf 'w300 w301\n/reset\nw300 w301\n/exit\nnever read\n' | chat > "$tmp/twice"
printf 'w310\nw300 w301\n' | chat > "$tmp/after"
printf '/system w320\nw300 w301\n' | chat > "$tmp/system"
python3 - "$tmp" <<'PY'
import sys, pathlib
d = pathlib.Path(sys.argv[1])
one, twice, after, system = ((d / n).read_bytes() for n in ("one", "twice", "after", "system"))
assert one.endswith(b"\n") and len(one) > 1, one
assert twice == one + one, (twice, one)                      # /reset, then the same answer; /exit stops reading
assert not after.endswith(b"\n" + one) or after == one + one, after  # the second turn saw the first
assert after != one + one, "a conversation's second turn answered as if alone"
assert system != one, "the system prompt changed nothing"
PY
grep -q "a new conversation" "$tmp/err"
echo "chat: ok"

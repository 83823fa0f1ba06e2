#!/usr/bin/env bash
# `troupe generate` with a constrained output: a JSON schema (inline and @file), a regex, a GBNF grammar
# file and a choice list on a fixture, greedy and sampled; the printed text satisfies each (checked by
# Python's json and re, not by troupe). Then a bad grammar, two guides at once and the oracle backend are
# refused with a message and a non-zero exit status.
set -euo pipefail
troupe="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$troupe" fixture --family llama --gguf --out "$tmp/m.gguf" > /dev/null
cat > "$tmp/schema.json" <<'JSON'
{"type": "object", "properties": {"id": {"type": "integer", "minimum": -5, "maximum": 5},
 "tag": {"type": "string", "pattern": "^[a-z]{1,4}$"}}, "required": ["id", "tag"], "additionalProperties": false}
JSON
printf 'root ::= "(" item ("," item){0,2} ")"\nitem ::= [0-9] | "x"\n' > "$tmp/list.gbnf"
gen() { "$troupe" generate --model "$tmp/m.gguf" --prompt "w300 w301" --max-tokens 80 --json "$@"; }
for sampling in "--temperature 0" "--temperature 1 --seed 3" "--temperature 1 --seed 4"; do
  # shellcheck disable=SC2086
  python3 - "$(gen $sampling --json-schema @"$tmp/schema.json")" <<'PY'
import json, re, sys
text = json.loads(sys.argv[1])["text"]
v = json.loads(text)
assert set(v) == {"id", "tag"}, text
assert isinstance(v["id"], int) and -5 <= v["id"] <= 5, text
assert re.fullmatch(r"[a-z]{1,4}", v["tag"]), text
PY
  # shellcheck disable=SC2086
  python3 - "$(gen $sampling --regex '[A-F]{2}-[0-9]{2,3}')" "$(gen $sampling --grammar @"$tmp/list.gbnf")" \
    "$(gen $sampling --choice north --choice south --choice 'east west')" <<'PY'
import json, re, sys
a, b, c = (json.loads(x)["text"] for x in sys.argv[1:])
assert re.fullmatch(r"[A-F]{2}-[0-9]{2,3}", a), a
assert re.fullmatch(r"\((\d|x)(,(\d|x)){0,2}\)", b), b
assert c in ("north", "south", "east west"), c
PY
done
fail() {  # a non-zero exit status (2 from troupe itself, CLI11's own for flags it refuses) and a message naming $1
  set +e
  out="$("$troupe" generate --model "$tmp/m.gguf" --prompt "w300" "${@:2}" 2>&1)"
  rc=$?
  set -e
  [ "$rc" != 0 ] || { echo "expected a refusal for ${*:2}, got exit 0: $out"; exit 1; }
  grep -q -- "$1" <<<"$out" || { echo "expected '$1' in: $out"; exit 1; }
}
fail "undefined_rule" --grammar 'root ::= nowhere'
fail "excludes" --regex 'a' --choice b
fail "oracle" --backend oracle --regex 'a'
fail "bad_schema\|unsupported" --json-schema '{"type": "object", "not": {}}'
echo "guided generate: ok"

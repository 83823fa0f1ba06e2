#!/usr/bin/env bash
# deploy/ stays true: every troupe command in the units, the container file and the manifests names
# only options `troupe <command> --help` lists; the YAML and the TOML parse; systemd accepts the units.
set -euo pipefail
troupe="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
fail=0

# "sub --opt ... --opt" lines: from ExecStart=, CMD [...] and args: [...].
commands() {
  sed -n 's|^ExecStart=[^ ]*troupe \(.*\)|\1|p' "$root"/deploy/systemd/*.service
  for f in "$root"/deploy/kubernetes/*.yaml "$root/deploy/container/Containerfile"; do
    python3 - "$f" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
# args: [...] (possibly over two lines) and CMD [...]
for m in re.finditer(r'(?:args:|CMD)\s*(\[[^\]]*\])', text, re.S):
    items = json.loads(m.group(1))
    print(" ".join(items))
PY
  done
}

while read -r sub rest; do
  [ -n "$sub" ] || continue
  help="$("$troupe" "$sub" --help 2>&1)" || { echo "unknown command: troupe $sub"; fail=1; continue; }
  for opt in $(echo "$rest" | grep -o -- '--[a-z0-9-]*' || true); do
    if ! grep -q -- "$opt" <<<"$help"; then echo "troupe $sub has no option $opt"; fail=1; fi
  done
  echo "ok: troupe $sub $(echo "$rest" | grep -o -- '--[a-z0-9-]*' | tr '\n' ' ')"
done < <(commands)

python3 - "$root"/deploy/kubernetes/*.yaml <<'PY'
import sys, yaml
for f in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(f)) if d]
    for d in docs:
        assert "apiVersion" in d and "kind" in d, f"{f}: a document without apiVersion/kind"
    print(f"ok: {f} ({len(docs)} documents)")
PY

# The example cluster file parses and maps its keys: the command gets as far as reading the secret
# file it names.
out="$("$troupe" status --cluster-file "$root/deploy/cluster.example.toml" 2>&1 || true)"
if ! grep -q "/etc/troupe/secret" <<<"$out"; then echo "cluster.example.toml: $out"; fail=1; else echo "ok: cluster.example.toml"; fi
bad="$(mktemp)"
printf '[cluster]\ncoordinater = "x:1"\n' > "$bad"
out="$("$troupe" status --cluster-file "$bad" 2>&1 || true)"
if ! grep -q "unknown key cluster.coordinater" <<<"$out"; then echo "a misspelt key is not refused: $out"; fail=1; else echo "ok: a misspelt key is refused"; fi
rm -f "$bad"

if command -v systemd-analyze >/dev/null; then
  dir="$(mktemp -d)"
  for u in "$root"/deploy/systemd/*.service; do
    # Verify against the built binary: the units name /usr/local/bin/troupe.
    sed "s|/usr/local/bin/troupe|$troupe|; s|^User=.*||" "$u" > "$dir/$(basename "$u")"
  done
  if ! systemd-analyze verify "$dir"/*.service 2>&1 | grep -v -e "Failed to connect" -e "not found" | tee "$dir/log" | grep -q .; then
    echo "ok: systemd-analyze verify"
  else
    echo "systemd-analyze verify:"; cat "$dir/log"; fail=1
  fi
  rm -rf "$dir"
fi
exit $fail

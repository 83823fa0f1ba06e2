#!/usr/bin/env bash
# The gateway's chat page in a real browser (Debian's chromium, headless, driven by puppeteer-core from
# tests/reference/chat_page.mjs): `troupe serve` on a fixture with an API key; the page loads, lists the
# model, streams an answer (its text seen growing) and answers in JSON mode with a JSON object. The
# screenshot is kept as an artifact: BUILD_DIR/artifacts/chat-page.png.
set -euo pipefail
# shellcheck source=tests/apps/lib/serve.sh
source "$(dirname "$0")/lib/serve.sh"
troupe="$1"
build="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
"$troupe" fixture --family llama --gguf --out "$tmp/m.gguf" > /dev/null
echo "sk-page" > "$tmp/keys"
start_serve "$troupe" "$tmp" --model "$tmp/m.gguf" --api-key-file "$tmp/keys"
url="$base/"
mkdir -p "$build/artifacts"
out="$(node "$root/tests/reference/chat_page.mjs" --url "$url" --api-key sk-page --screenshot "$build/artifacts/chat-page.png")"
python3 - "$out" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["models"], r
assert r["cls"] == "msg assistant", r
assert r["text"], r
assert len(r["lengths_seen"]) >= 3, ("the answer should be seen growing while it streams", r["lengths_seen"])
assert "tokens" in r["meta"], r
assert r["json_ok"], ("JSON mode answers a JSON object", r["json_text"])
assert not r["page_errors"], r["page_errors"]
PY
[ -s "$build/artifacts/chat-page.png" ] || { echo "no screenshot"; exit 1; }
echo "chat page: ok ($build/artifacts/chat-page.png)"

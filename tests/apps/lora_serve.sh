#!/usr/bin/env bash
# LoRA adapters through `troupe serve` and the openai client: --lora-modules loads one adapter into
# every replica and /v1/load_lora_adapter a second while serving (a name taken or a missing path: 400);
# a completion for model NAME or SERVED:NAME gives the text and log-probabilities (2e-4)
# of a server of the checkpoint with that adapter merged (one slot for two adapters: they take turns),
# the served name alone the base's, /v1/models lists NAME and SERVED:NAME, and a name no replica
# loaded is refused as an unknown model (404), as is an adapter after /v1/unload_lora_adapter. The
# fixture has no tokenizer: prompts are token ids.
set -euo pipefail
troupe="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=tests/apps/lib/serve.sh
source "$(dirname "$0")/lib/serve.sh"
tmp="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
"$troupe" fixture --family qwen2 --out "$tmp/base" --dims 512,128,256,2,4,2,32 > /dev/null
for a in sql chat; do
  seed=$([ "$a" = sql ] && echo 3 || echo 9)
  "$troupe" fixture --family qwen2 --lora-over "$tmp/base" --lora-rank 8 --seed "$seed" --out "$tmp/$a" > /dev/null
  "$troupe" fixture --family qwen2 --lora-over "$tmp/base" --merged-with "$tmp/$a" --out "$tmp/merged-$a" > /dev/null
done
prompt="3,50,70,90,110,130"
ask() { (cd "$root" && node tests/reference/openai_models.mjs "$base/v1" "$prompt" "$@"); }
post() {  # POST PATH JSON -> "STATUS BODY"
  python3 - "$base$1" "$2" <<'PY'
import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY
}
expect() { case "$1" in "$2"*) ;; *) echo "expected $2: $1"; exit 1 ;; esac; }
# sql from the command line; chat loaded while serving (vLLM's /v1/load_lora_adapter), then unloaded.
start_serve "$troupe" "$tmp" --model "$tmp/base" --lora-modules "sql=$tmp/sql" --max-loras 1 --max-lora-rank 8 --max-rows 4
served="$(grep -o "serving '[^']*'" "$tmp/serve.out" | sed "s/serving '\(.*\)'/\1/")"
expect "$(post /v1/load_lora_adapter "{\"lora_name\": \"chat\", \"lora_path\": \"$tmp/chat\"}")" "200 Success"
expect "$(post /v1/load_lora_adapter "{\"lora_name\": \"chat\", \"lora_path\": \"$tmp/chat\"}")" "400"
expect "$(post /v1/load_lora_adapter "{\"lora_name\": \"bad\", \"lora_path\": \"$tmp/no-such\"}")" "400"
ask "$served" sql "$served:chat" "$served:nope" > "$tmp/adapters.json"
expect "$(post /v1/unload_lora_adapter '{"lora_name": "chat"}')" "200 Success"
expect "$(post /v1/unload_lora_adapter '{"lora_name": "chat"}')" "400"
ask chat > "$tmp/unloaded.json"
kill "$server"; wait "$server" 2>/dev/null || true; server=""
for a in sql chat; do
  start_serve "$troupe" "$tmp" --model "$tmp/merged-$a"
  ask "$(grep -o "serving '[^']*'" "$tmp/serve.out" | sed "s/serving '\(.*\)'/\1/")" > "$tmp/merged-$a.json"
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
done
python3 - "$tmp" "$served" <<'PY'
import json, sys
tmp, served = sys.argv[1], sys.argv[2]
got = json.load(open(f"{tmp}/adapters.json"))
def only(path):
    d = json.load(open(path))
    return next(v for k, v in d.items() if k != "models")
def same(a, b, what):
    assert len(a["logprobs"]) == 8 and len(b["logprobs"]) == 8, (what, a, b)
    assert a["text"] == b["text"], (what, a["text"], b["text"])
    assert all(abs(x - y) <= 2e-4 for x, y in zip(a["logprobs"], b["logprobs"])), (what, a["logprobs"], b["logprobs"])
same(got["sql"], only(f"{tmp}/merged-sql.json"), "sql")
same(got[f"{served}:chat"], only(f"{tmp}/merged-chat.json"), "chat")
assert got[served]["text"] != got["sql"]["text"] or got[served]["logprobs"] != got["sql"]["logprobs"], "the adapter changed nothing"
assert got[f"{served}:nope"]["status"] == 404, got[f"{served}:nope"]
unloaded = json.load(open(f"{tmp}/unloaded.json"))
assert unloaded["chat"]["status"] == 404 and "chat" not in unloaded["models"], unloaded
assert {"sql", f"{served}:sql", "chat", f"{served}:chat"} <= set(got["models"]), got["models"]
print("lora_serve:", {k: v.get("text", v.get("status")) for k, v in got.items() if k != "models"}, "models", got["models"])
PY
echo "lora_serve: ok"

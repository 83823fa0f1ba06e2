#!/usr/bin/env bash
# An image through `troupe serve` and the openai client (docs/vision.md): the gemma3_vl fixture's text
# GGUF with --mmproj; a chat message of text, an image_url data URL and text gives, step by step, the
# log-probabilities llama.cpp's multimodal path gives for the same rendered prompt with the image at the
# marker (within 5e-3); an http URL and a data URL that is not base64 are refused (400).
set -euo pipefail
troupe="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=tests/apps/lib/serve.sh
source "$(dirname "$0")/lib/serve.sh"
tmp="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
cd "$root"
ref="$(scripts/build-llama-mtmd)"
"$troupe" fixture --family gemma3_vl --out "$tmp/vl" > /dev/null
start_serve "$troupe" "$tmp" --model "$tmp/vl/text.gguf" --mmproj "$tmp/vl/mmproj.gguf" --max-rows 4
served="$(grep -o "serving '[^']*'" "$tmp/serve.out" | sed "s/serving '\(.*\)'/\1/")"
node tests/reference/openai_image.mjs "$base/v1" "$served" "$tmp/vl/image.png" 10 > "$tmp/api.json"
node tests/reference/openai_image.mjs "$base/v1" "$served" "$tmp/vl/image.png" 2 "https://example.com/cat.png" > "$tmp/http.json"
node tests/reference/openai_image.mjs "$base/v1" "$served" "$tmp/vl/image.png" 2 "data:image/png;base64,@@@@" > "$tmp/junk.json"
# The fixture's ChatML template around the same content, the image at llama.cpp's marker.
printf '<|im_start|>user\nw300 w301<__media__> w302 w303 w304<|im_end|>\n<|im_start|>assistant\n' > "$tmp/prompt.txt"
"$ref" "$tmp/vl/text.gguf" "$tmp/vl/mmproj.gguf" "$tmp/vl/image.png" "@$tmp/prompt.txt" 10 > "$tmp/llama.json"
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
api = json.load(open(f"{tmp}/api.json"))
ref = json.load(open(f"{tmp}/llama.json"))
assert "logprobs" in api, api
n = len(api["logprobs"])
assert n >= 4, api
worst = max(abs(a - b) for a, b in zip(api["logprobs"], ref["logprobs"][:n]))
assert worst < 5e-3, (worst, api["logprobs"], ref["logprobs"])
for name in ("http", "junk"):
    r = json.load(open(f"{tmp}/{name}.json"))
    assert r.get("status") == 400 and "image_url" in r.get("message", ""), (name, r)
print(f"{n} tokens through the gateway, worst log-probability difference to llama.cpp {worst:.2e}; http and junk URLs refused")
PY

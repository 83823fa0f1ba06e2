#!/usr/bin/env bash
# `troupe embed` against the served /v1/embeddings of the same model (troupe serve): the same vectors
# (cosine > 0.9999) for several texts given as flags and on stdin; unit length; --pooling mean differs
# from the default and --no-normalize keeps the raw length; a bad --pooling is refused.
set -euo pipefail
# shellcheck source=tests/apps/lib/serve.sh
source "$(dirname "$0")/lib/serve.sh"
troupe="$1"
tmp="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
"$troupe" fixture --family qwen3 --gguf --out "$tmp/m.gguf" > /dev/null
"$troupe" embed --model "$tmp/m.gguf" --input "w300 w301" --input "w302 w303 w304" > "$tmp/flags.json"
printf 'w300 w301\nw302 w303 w304\n' | "$troupe" embed --model "$tmp/m.gguf" > "$tmp/stdin.json"
"$troupe" embed --model "$tmp/m.gguf" --input "w300 w301" --pooling mean > "$tmp/mean.json"
"$troupe" embed --model "$tmp/m.gguf" --input "w300 w301" --no-normalize > "$tmp/raw.json"
if "$troupe" embed --model "$tmp/m.gguf" --input x --pooling max 2> "$tmp/bad.err"; then echo "--pooling max was taken"; exit 1; fi
grep -q "mean, cls or last" "$tmp/bad.err"
start_serve "$troupe" "$tmp" --model "$tmp/m.gguf"
python3 - "$base" "$tmp" <<'PY'
import json, math, sys, urllib.request
base, tmp = sys.argv[1], sys.argv[2]
req = urllib.request.Request(base + "/v1/embeddings", data=json.dumps({"input": ["w300 w301", "w302 w303 w304"]}).encode(),
                             headers={"Content-Type": "application/json"})
served = [d["embedding"] for d in json.load(urllib.request.urlopen(req))["data"]]
load = lambda n: json.load(open(f"{tmp}/{n}.json"))
flags, stdin, mean, raw = load("flags"), load("stdin"), load("mean"), load("raw")
cos = lambda a, b: sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
norm = lambda a: math.sqrt(sum(x * x for x in a))
assert flags["pooling"] == "last" and flags["normalize"] and flags["declared_by"] == "default", flags["pooling"]
for i in range(2):
    v = flags["data"][i]["embedding"]
    assert cos(v, served[i]) > 0.9999, (i, cos(v, served[i]))
    assert cos(v, stdin["data"][i]["embedding"]) > 0.9999
    assert abs(norm(v) - 1) < 1e-5, norm(v)
assert mean["pooling"] == "mean" and cos(mean["data"][0]["embedding"], flags["data"][0]["embedding"]) < 0.9999
assert abs(norm(raw["data"][0]["embedding"]) - 1) > 1e-3 and cos(raw["data"][0]["embedding"], flags["data"][0]["embedding"]) > 0.9999
PY
echo "embed: ok"

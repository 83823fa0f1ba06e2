#!/usr/bin/env bash
# A vision-language model against llama.cpp's multimodal path (libmtmd of node-llama-cpp 3.21.1's
# llama.cpp, scripts/build-llama-mtmd): the gemma3_vl fixture's text GGUF + mmproj, a prompt with an
# image (a non-square PNG, resized and padded as llama.cpp does, and a square one), greedy: troupe's
# tokens equal llama.cpp's and each step's log-probability is within 5e-3 (f16 KV caches both sides);
# the Hugging Face form gives the GGUF form's tokens and log-probabilities; the two images move the
# log-probabilities far more than the bound (the image reaches the text). A prompt whose image marks
# and images disagree is refused.
set -euo pipefail
troupe="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$root"
ref="$(scripts/build-llama-mtmd)"
"$troupe" fixture --family gemma3_vl --out "$tmp/vl" > /dev/null
# A third image as some cameras and editors write them: 16-bit RGB with a gAMA of 1.0. llama.cpp's reader
# keeps each sample's high byte and ignores the gamma; so must troupe's (libpng's simplified reader
# converted it to sRGB, 0.17 of log-probability away).
python3 - "$tmp/vl/deep.png" <<'PY'
import math, struct, sys, zlib
w, h = 41, 27
def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
rows = b''.join(b'\0' + b''.join(struct.pack('>H', int(32767 + 30000 * math.sin(0.07 * x * (c + 1) + 0.11 * y + c)))
                                  for x in range(w) for c in range(3)) for y in range(h))
open(sys.argv[1], 'wb').write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 16, 2, 0, 0, 0)) +
                              chunk(b'gAMA', struct.pack('>I', 100000)) + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))
PY
for image in image square deep; do
  "$ref" "$tmp/vl/text.gguf" "$tmp/vl/mmproj.gguf" "$tmp/vl/$image.png" "w300 w301<__media__> w302 w303 w304" 12 > "$tmp/llama-$image.json"
  # llama.cpp's prompt with its image rows (-1) and the end token after them taken out: troupe puts them back.
  ids="$(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["prompt"]
out, skip = [], False
for t in p:
    if t == -1: skip = True; continue
    if skip: skip = False; continue
    out.append(t)
print(",".join(map(str, out)))' "$tmp/llama-$image.json")"
  "$troupe" generate --model "$tmp/vl/text.gguf" --mmproj "$tmp/vl/mmproj.gguf" --image "$tmp/vl/$image.png" --prompt-ids "$ids" \
    --max-tokens 12 --logprobs 1 --json 2>/dev/null > "$tmp/troupe-$image.json"
  "$troupe" generate --model "$tmp/vl/hf" --image "$tmp/vl/$image.png" --prompt-ids "$ids" --max-tokens 12 --logprobs 1 --json 2>/dev/null \
    > "$tmp/troupe-hf-$image.json"
  if "$troupe" generate --model "$tmp/vl/text.gguf" --mmproj "$tmp/vl/mmproj.gguf" --prompt-ids "$ids" --max-tokens 2 2> "$tmp/err" > /dev/null; then
    echo "a prompt with an image mark and no image was served"; exit 1
  fi
  grep -q "marks 1 images" "$tmp/err"
done
# The sequence's room counts the image's rows, not just the ids given (a short answer was refused as
# too long: the capacity was sized before the image grew the prompt).
# max_tokens takes the ids to a whole block of 16, so no rounding could hide the image's rows.
n_ids=$(tr ',' '\n' <<< "$ids" | wc -l)
"$troupe" generate --model "$tmp/vl/text.gguf" --mmproj "$tmp/vl/mmproj.gguf" --image "$tmp/vl/image.png" --prompt-ids "$ids" \
  --max-tokens $((16 - n_ids % 16)) > /dev/null 2>&1
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
lp = {}
for image in ("image", "square", "deep"):
    ref = json.load(open(f"{tmp}/llama-{image}.json"))
    mine = json.load(open(f"{tmp}/troupe-{image}.json"))
    hf = json.load(open(f"{tmp}/troupe-hf-{image}.json"))
    assert mine["tokens"] == ref["tokens"], (image, mine["tokens"], ref["tokens"])
    assert hf["tokens"] == mine["tokens"], (image, hf["tokens"], mine["tokens"])
    worst = 0.0
    for i, (tok, want) in enumerate(zip(mine["tokens"], ref["logprobs"])):
        got = mine["logprobs"][i][0]
        assert got["id"] == tok, (image, i)
        worst = max(worst, abs(got["logprob"] - want))
        assert abs(hf["logprobs"][i][0]["logprob"] - got["logprob"]) < 1e-4, (image, i)
    assert worst < 5e-3, (image, worst)
    lp[image] = ref["logprobs"]
    print(f"{image}: {len(ref['tokens'])} tokens equal llama.cpp's, worst log-probability difference {worst:.2e}")
moved = max(abs(a - b) for a, b in zip(lp["image"], lp["square"]))
assert moved > 2e-2, ("the image does not reach the text", moved)
print(f"the two images move the log-probabilities by up to {moved:.3f}")
PY

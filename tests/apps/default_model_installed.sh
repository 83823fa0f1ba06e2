#!/usr/bin/env bash
# An installed troupe finds its embedded model through its own location, not the source tree: install
# the build into a temporary prefix, move the prefix elsewhere (a relocated install), and run
# `troupe generate` without --model from an unrelated directory.
set -euo pipefail
build="$1"
dir="$(mktemp -d /tmp/troupe-install.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
cmake --install "$build" --prefix "$dir/prefix" >/dev/null
mv "$dir/prefix" "$dir/moved"
cd "$dir"
out="$(env -u TROUPE_DEFAULT_MODEL "$dir/moved/bin/troupe" generate --prompt "And God said" --max-tokens 24 --temperature 0 2>"$dir/err")"
grep -qF "using the embedded model troupe-kjv ($dir/moved/share/troupe/models/troupe-kjv.gguf)" "$dir/err" || {
  echo "the installed binary did not find its model:"; cat "$dir/err"; exit 1; }
words="$(echo "$out" | wc -w)"
[ "$words" -ge 8 ] || { echo "too little text: $out"; exit 1; }
echo "$out"
# A bad TROUPE_DEFAULT_MODEL is refused by name, with no crash.
if TROUPE_DEFAULT_MODEL=/nonexistent.gguf "$dir/moved/bin/troupe" generate --prompt x --max-tokens 1 2>"$dir/err2"; then
  echo "a missing TROUPE_DEFAULT_MODEL was accepted"; exit 1
fi
grep -q "/nonexistent.gguf" "$dir/err2" || { cat "$dir/err2"; exit 1; }
# The installed binary opens its cluster module from <prefix>/<libdir>/troupe.
"$dir/moved/bin/troupe" certs init --dir "$dir/certs" >/dev/null 2>"$dir/err3" || {
  echo "the installed binary could not run a cluster command:"; cat "$dir/err3"; exit 1; }
echo "installed default model test passed"

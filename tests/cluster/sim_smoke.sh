#!/usr/bin/env bash
# troupe sim end to end: two node processes join, a model deploys on both, a job is served through
# `troupe submit`, a killed node leaves the status, `quit` stops every process.
set -euo pipefail
troupe="$1"
dir="$(mktemp -d /tmp/troupe-sim-test.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
"$troupe" fixture --family llama --gguf --dims 512,128,256,2,4,2,32 --out "$dir/m.gguf" >/dev/null
mkfifo "$dir/cmd"
"$troupe" sim --nodes 2 --model "$dir/m.gguf" --capacity 256 --max-rows 4 --dir "$dir/sim" < "$dir/cmd" > "$dir/out" 2>&1 &
sim=$!
exec 3> "$dir/cmd"
for _ in $(seq 300); do grep -q "deployed on 2 replica" "$dir/out" && break; sleep 0.1; done
grep -q "deployed on 2 replica" "$dir/out" || { cat "$dir/out"; exit 1; }
port="$(sed -n 's/.*coordinator 127.0.0.1:\([0-9]*\),.*/\1/p' "$dir/out")"
answer="$("$troupe" submit --cluster-file "$dir/sim/cluster.toml" --prompt-ids 5,6,7 --max-tokens 6 --json)"
echo "$answer" | grep -q '"finish_reason":"length"' || { echo "bad answer: $answer"; exit 1; }
# The node set of the latest status line, sorted (nodes rejoin in any order; under load a slow node
# may even be declared lost and rejoin, which reorders the list).
nodes_now() {
  grep '"nodes"' "$dir/out" | tail -1 | python3 -c 'import json,sys; print(",".join(sorted(n["id"] for n in json.loads(sys.stdin.read())["nodes"])))' 2>/dev/null || true
}
wait_nodes() {  # wait_nodes WANT WHY: ask for status until the node set is WANT (sorted, comma-separated)
  for _ in $(seq 150); do echo "status" >&3; sleep 0.1; [ "$(nodes_now)" = "$1" ] && return 0; done
  echo "$2 (nodes: $(nodes_now), want $1)"; grep -v '^{"jobs"' "$dir/out"
  for f in "$dir"/sim/*.log; do echo "== $f"; tail -40 "$f"; done  # what each process saw
  exit 1
}
# Cut node 0's link: it leaves the status; restore it: it joins again.
echo "cut 0" >&3
wait_nodes "sim-node-1" "a cut node stayed"
echo "restore 0" >&3
wait_nodes "sim-node-0,sim-node-1" "a restored node did not rejoin"
echo "kill 1" >&3
wait_nodes "sim-node-0" "a killed node stayed"
echo "quit" >&3
exec 3>&-
wait "$sim"
grep -q "troupe sim: stopped" "$dir/out"
if pgrep -f "$dir/sim/secret" >/dev/null; then echo "processes left behind"; exit 1; fi
echo "sim smoke test passed"

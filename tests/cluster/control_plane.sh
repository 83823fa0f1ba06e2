#!/usr/bin/env bash
# The control plane end to end on a 3-node `troupe sim`: two different models, two replicas each,
# spread so that no node holds both replicas of one model; 24 interleaved jobs through `troupe submit
# --model`, each with the tokens `troupe generate` gives for its own model; a deploy that cannot prepare
# fails naming the node and the reason and leaves 3 nodes and 4 serving replicas; a second identical
# deploy leaves the count; after `kill -9` of a node the coordinator restores 4 serving replicas on the
# other two within 30 s; an unknown model is refused at once; the sim exits within 5 s of SIGTERM with
# no process left; a second `troupe serve` on a port in use exits non-zero before loading anything.
set -euo pipefail
troupe="$1"
dir="$(mktemp -d /tmp/troupe-cp-test.XXXXXX)"
sim=""
cleanup() {
  [ -n "$sim" ] && kill "$sim" 2>/dev/null || true
  pkill -f "$dir/" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/sim/*.log; do echo "== $f"; tail -30 "$f"; done; exit 1; }

"$troupe" fixture --family llama --gguf --dims 512,128,256,2,4,2,32 --out "$dir/alpha.gguf" >/dev/null
"$troupe" fixture --family qwen2 --out "$dir/beta" --dims 384,128,256,2,4,2,32 >/dev/null

mkfifo "$dir/cmd"
"$troupe" sim --nodes 3 --no-model --heartbeat-ms 200 --timeout-ms 1000 --dir "$dir/sim" < "$dir/cmd" > "$dir/out" 2>&1 &
sim=$!
exec 3> "$dir/cmd"
for _ in $(seq 300); do grep -q "coordinator 127.0.0.1" "$dir/out" && break; sleep 0.1; done
port="$(sed -n 's/.*coordinator 127.0.0.1:\([0-9]*\),.*/\1/p' "$dir/out")"
[ -n "$port" ] || fail "no coordinator: $(cat "$dir/out")"
at=(--cluster-file "$dir/sim/cluster.toml")
status() { "$troupe" status "${at[@]}" --json; }
# py EXPR: evaluates EXPR over the status JSON `s`.
py() { status | python3 -c "import json,sys; s=json.load(sys.stdin); print($1)"; }
for _ in $(seq 100); do [ "$(py 'len(s["nodes"])')" = 3 ] && break; sleep 0.1; done
[ "$(py 'len(s["nodes"])')" = 3 ] || fail "3 nodes did not join"

"$troupe" deploy "${at[@]}" --model "$dir/alpha.gguf" --replicas 2 --capacity 256 --max-rows 4 | grep -q "deployed 'alpha'" || fail "deploy alpha"
"$troupe" deploy "${at[@]}" --model "$dir/beta/" --replicas 2 --capacity 256 --max-rows 4 | grep -q "deployed 'beta'" || fail "deploy beta"
serving='sum(1 for r in s["replicas"] if r["state"]=="serving")'
spread='all(len(set(r["node"] for r in s["replicas"] if r["model"]==m))==len([r for r in s["replicas"] if r["model"]==m]) for m in ("alpha","beta"))'
[ "$(py "$serving")" = 4 ] || fail "4 serving replicas: $(status)"
[ "$(py "$spread")" = True ] || fail "replicas of one model share a node: $(status)"

# 24 interleaved jobs (12 at a time: each is a process of its own), each compared with generate on its
# own checkpoint.
pids=()
for i in $(seq 0 23); do
  if [ "$i" = 12 ]; then for p in "${pids[@]}"; do wait "$p" || fail "a job failed: $(cat "$dir"/job*.err)"; done; pids=(); fi
  if [ $((i % 2)) = 0 ]; then m=alpha; else m=beta; fi
  ids="$((3 + i)),$((7 + 2 * i)),$((11 + i % 5))"
  "$troupe" submit "${at[@]}" --model "$m" --prompt-ids "$ids" --max-tokens 8 --json > "$dir/job$i.json" 2> "$dir/job$i.err" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "a job failed: $(cat "$dir"/job*.err)"; done
tokens() { sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/' "$1"; }
for i in $(seq 0 23); do
  if [ $((i % 2)) = 0 ]; then path="$dir/alpha.gguf"; else path="$dir/beta"; fi
  ids="$((3 + i)),$((7 + 2 * i)),$((11 + i % 5))"
  "$troupe" generate --model "$path" --prompt-ids "$ids" --max-tokens 8 --json 2>/dev/null > "$dir/ref$i.json"
  [ "$(tokens "$dir/job$i.json")" = "$(tokens "$dir/ref$i.json")" ] || fail "job $i: $(tokens "$dir/job$i.json") != $(tokens "$dir/ref$i.json")"
done
# A model nobody serves is refused at once, by code.
if "$troupe" submit "${at[@]}" --model gamma --prompt-ids 1,2 --max-tokens 2 2> "$dir/unknown.err"; then fail "an unknown model was served"; fi
grep -q "unknown_model" "$dir/unknown.err" || fail "unknown model: $(cat "$dir/unknown.err")"
# Without --model, two served models is a refusal that names them.
if "$troupe" submit "${at[@]}" --prompt-ids 1,2 --max-tokens 2 2> "$dir/unnamed.err"; then fail "an unnamed model was guessed"; fi

# A deploy that cannot prepare: named node and reason, the cluster as it was.
if "$troupe" deploy "${at[@]}" --model "$dir/alpha.gguf" --name too-long --replicas 1 --capacity 65536 --max-rows 4 > "$dir/bad.out" 2>&1; then
  fail "a replica that cannot prepare was deployed"
fi
grep -q "node 'sim-node-" "$dir/bad.out" || fail "the failed deploy names no node: $(cat "$dir/bad.out")"
sleep 1
[ "$(py 'len(s["nodes"])')" = 3 ] || fail "a node left after the failed deploy: $(status)"
[ "$(py "$serving")" = 4 ] || fail "the failed deploy changed the serving replicas: $(status)"
[ "$(py 'len([d for d in s["deployments"] if d["name"]=="too-long"])')" = 0 ] || fail "the failed deployment stayed"
# Deploying the same thing again keeps its count.
"$troupe" deploy "${at[@]}" --model "$dir/alpha.gguf" --replicas 2 --capacity 256 --max-rows 4 > /dev/null || fail "redeploy"
[ "$(py 'len([r for r in s["replicas"] if r["model"]=="alpha"])')" = 2 ] || fail "a second identical deploy changed the count: $(status)"

# kill -9 of a node: 4 serving replicas again on the two left, within 30 s, still spread.
victim="$(py 's["replicas"][0]["node"]')"
echo "kill ${victim#sim-node-}" >&3
t0=$(date +%s)
for _ in $(seq 300); do
  [ "$(py 'len(s["nodes"])')" = 2 ] && [ "$(py "$serving")" = 4 ] && break
  sleep 0.1
done
[ "$(py 'len(s["nodes"])')" = 2 ] && [ "$(py "$serving")" = 4 ] || fail "replicas not restored after the node was killed: $(status)"
echo "restored 4 replicas in $(( $(date +%s) - t0 )) s"
[ "$(py "$spread")" = True ] || fail "the replacements share a node with their model: $(status)"
"$troupe" submit "${at[@]}" --model beta --prompt-ids 4,9,12 --max-tokens 8 --json > "$dir/after.json" || fail "a job after the loss"
[ "$(tokens "$dir/after.json")" = "$(tokens "$dir/ref1.json")" ] || fail "after the loss: $(tokens "$dir/after.json")"

# SIGTERM: the sim is gone within 5 s and leaves no process behind.
kill -TERM "$sim"
t0=$(date +%s%N)
rc=0
for _ in $(seq 50); do kill -0 "$sim" 2>/dev/null || break; sleep 0.1; done
kill -0 "$sim" 2>/dev/null && fail "the sim outlived SIGTERM by 5 s"
wait "$sim" || rc=$?
sim=""
echo "sim stopped in $(( ($(date +%s%N) - t0) / 1000000 )) ms, exit $rc"
[ "$rc" = 143 ] || fail "the sim exited $rc on SIGTERM, not 143"
pgrep -f "$dir/sim/secret" >/dev/null && fail "processes of the sim are left"

# A model no node's declared memory holds (the embedded one on two 9 MiB nodes), deployed by the sim with
# no split flag: one replica in two pipeline stages across the nodes, with one device's tokens.
mkfifo "$dir/cmd2"
"$troupe" sim --nodes 2 --device-memory 9MiB --dir "$dir/sim2" < "$dir/cmd2" > "$dir/out2" 2>&1 &
sim=$!
exec 4> "$dir/cmd2"
for _ in $(seq 300); do grep -q "deployed on\|deploy:" "$dir/out2" && break; sleep 0.1; done
grep -q "deployed on 1 replica" "$dir/out2" || fail "the split deploy: $(cat "$dir/out2")"
port2="$(sed -n 's/.*coordinator 127.0.0.1:\([0-9]*\),.*/\1/p' "$dir/out2")"
at2=(--cluster-file "$dir/sim2/cluster.toml")
split="$("$troupe" status "${at2[@]}" --json | python3 -c 'import json,sys; r=json.load(sys.stdin)["replicas"][0]; print(r["pipeline_parallel"], len(set(r["nodes"])))')"
[ "$split" = "2 2" ] || fail "the model was not split across the two nodes: $split"
got="$("$troupe" submit "${at2[@]}" --prompt "And God said" --max-tokens 16 --json | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')"
want="$("$troupe" generate --prompt "And God said" --max-tokens 16 --json 2>/dev/null | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')"
[ -n "$want" ] && [ "$got" = "$want" ] || fail "the split replica: $got != $want"
echo quit >&4
exec 4>&-
wait "$sim" || true
sim=""

# A second serve on a port in use exits non-zero at once.
python3 -c "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1',0)); s.listen(); open('$dir/busy','w').write(str(s.getsockname()[1])); time.sleep(30)" &
holder=$!
for _ in $(seq 50); do [ -s "$dir/busy" ] && break; sleep 0.1; done
if timeout 10 "$troupe" serve --model "$dir/alpha.gguf" --port "$(cat "$dir/busy")" > "$dir/serve.out" 2>&1; then fail "serve started on a port in use"; fi
grep -q "in use" "$dir/serve.out" || fail "serve on a used port: $(cat "$dir/serve.out")"
grep -q "loading" "$dir/serve.out" && fail "serve loaded the model before refusing the port"
kill "$holder" 2>/dev/null || true
echo "control plane: routing by model, spread, failed deploys isolated, reconciliation, signals, ports"

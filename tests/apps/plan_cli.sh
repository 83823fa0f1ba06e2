#!/usr/bin/env bash
# `troupe plan` on the embedded model (4 layers of 1.5 MiB, 1 MiB embedding and head, about 4.4 MiB of
# scratch): two 9 MiB nodes hold it only as two pipeline stages, one on each node, and the suggested
# deploy says so; one 4 MiB device is refused with the shortfall; a malformed node is refused by name.
# Then on a running cluster of two nodes declaring 9 MiB each, `troupe deploy --plan capacity` deploys
# that plan (two stages across the nodes) and a job's answer is one device's.
set -euo pipefail
troupe="$1"
out="$("$troupe" plan --node a=cpu:9MiB --node b=cpu:9MiB --goal capacity 2>/dev/null)"
echo "$out" | grep -q "pipeline 2 x tensor parallel 1, 1 replica" || { echo "plan: $out"; exit 1; }
echo "$out" | grep -q -- "--pipeline-parallel 2 --across-nodes" || { echo "deploy line: $out"; exit 1; }
j="$("$troupe" plan --node a=cpu:64MiB*2 --json 2>/dev/null)"
echo "$j" | grep -q '"tensor_parallel":2' || { echo "latency plan on two devices: $j"; exit 1; }
if "$troupe" plan --node a=cpu:4MiB 2>"${TMPDIR:-/tmp}/plan.$$"; then echo "a model larger than the device was placed"; exit 1; fi
grep -q "does not fit" "${TMPDIR:-/tmp}/plan.$$" || { cat "${TMPDIR:-/tmp}/plan.$$"; exit 1; }
if "$troupe" plan --node a=tpu:9MiB 2>"${TMPDIR:-/tmp}/plan.$$"; then echo "an unknown device kind was accepted"; exit 1; fi
grep -q "cuda or cpu" "${TMPDIR:-/tmp}/plan.$$" || { cat "${TMPDIR:-/tmp}/plan.$$"; exit 1; }
rm -f "${TMPDIR:-/tmp}/plan.$$"

dir="$(mktemp -d /tmp/troupe-plan-test.XXXXXX)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
echo "plan-test-secret-0123456789abcdef" > "$dir/secret"
"$troupe" coordinator --listen 127.0.0.1:0 --insecure --secret-file "$dir/secret" --port-file "$dir/port" > "$dir/c.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
at=(--coordinator "127.0.0.1:$(cat "$dir/port")" --insecure --secret-file "$dir/secret")
for n in a b; do
  "$troupe" node --join "127.0.0.1:$(cat "$dir/port")" --insecure --secret-file "$dir/secret" --node-id "$n" --device-memory 9MiB > "$dir/$n.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do "$troupe" status "${at[@]}" --json 2>/dev/null | grep -q '"b"' && "$troupe" status "${at[@]}" --json | grep -q '"a"' && break; sleep 0.1; done
out="$("$troupe" deploy "${at[@]}" --plan capacity)" || { echo "deploy --plan: $out"; cat "$dir"/*.log; exit 1; }
echo "$out" | grep -q "plan (capacity): cpu, pipeline 2 x tensor parallel 1, 1 replica" || { echo "deploy --plan: $out"; exit 1; }
got="$("$troupe" submit "${at[@]}" --prompt "And God said" --max-tokens 16 --json | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')"
want="$("$troupe" generate --prompt "And God said" --max-tokens 16 --json 2>/dev/null | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')"
[ -n "$want" ] && [ "$got" = "$want" ] || { echo "planned replica: $got != $want"; cat "$dir"/*.log; exit 1; }
echo "plan: stages across nodes when one device is too small (planned and deployed), refusals by name"

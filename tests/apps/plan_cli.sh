#!/usr/bin/env bash
# `troupe plan` on the embedded model (4 layers of 1.5 MiB, 1 MiB embedding and head, about 4.4 MiB of
# scratch): two 9 MiB nodes hold it only as two pipeline stages, one on each node, and the suggested
# deploy says so; one 4 MiB device is refused with the shortfall; a malformed node is refused by name.
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
echo "plan: stages across nodes when one device is too small, refusals by name"

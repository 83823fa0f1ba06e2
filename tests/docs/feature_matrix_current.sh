#!/usr/bin/env bash
# docs/feature-matrix.md must be what `troupe feature-matrix` prints from this build's registry.
set -euo pipefail
troupe="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
if ! diff -u "$root/docs/feature-matrix.md" <("$troupe" feature-matrix); then
  echo "docs/feature-matrix.md is stale: regenerate it with: troupe feature-matrix > docs/feature-matrix.md" >&2
  exit 1
fi

#!/usr/bin/env bash
# The cluster's commands live in libtroupe-cluster.so (apps/cluster_module.hpp): the binary itself must
# not depend on CAF, OpenSSL, cpp-httplib, Cap'n Proto, Gloo or NCCL, the module must open and run a
# cluster command, and a missing or foreign module is refused by name (exit 2), never a crash.
set -euo pipefail
troupe="$1"
dir="$(mktemp -d /tmp/troupe-module.XXXXXX)"
trap 'rm -rf "$dir"' EXIT

needed="$(readelf -d "$troupe" | grep NEEDED || true)"
for lib in libcaf_core libcaf_io libcaf_openssl libssl libcrypto libcpp-httplib libcapnp libkj libgloo libnccl; do
  if grep -q "\[$lib" <<<"$needed"; then
    echo "the troupe binary still depends on $lib:"; echo "$needed"; exit 1
  fi
done
module="$(dirname "$troupe")/libtroupe-cluster.so"
[ -f "$module" ] || { echo "no module beside the binary: $module"; exit 1; }
mneeded="$(readelf -d "$module" | grep NEEDED)"
grep -q 'libcaf_core' <<<"$mneeded" || { echo "the module does not link CAF:"; echo "$mneeded"; exit 1; }
# Its only exported function is the entry point.
exported="$(nm -D --defined-only "$module" | awk '$2 == "T" {print $3}')"
[ "$exported" = "troupe_cluster_module" ] || { echo "the module exports more than its entry point:"; echo "$exported" | head; exit 1; }

# A cluster command runs through the module: a certificate authority and a node certificate.
"$troupe" certs init --dir "$dir/certs" >/dev/null
"$troupe" certs issue --dir "$dir/certs" --name node-a >/dev/null
ls "$dir/certs" | grep -q 'node-a' || { echo "certs issue wrote no node certificate"; ls "$dir/certs"; exit 1; }

# A local command does not open the module: it works with the module unreachable.
TROUPE_CLUSTER_MODULE=/nonexistent/libtroupe-cluster.so "$troupe" generate --prompt-ids 1,2,3 --max-tokens 2 >/dev/null

# A missing module is refused by path.
if TROUPE_CLUSTER_MODULE=/nonexistent/libtroupe-cluster.so "$troupe" certs init --dir "$dir/c2" 2>"$dir/err"; then
  echo "a missing module was accepted"; exit 1
fi
grep -q '/nonexistent/libtroupe-cluster.so: not found' "$dir/err" || { cat "$dir/err"; exit 1; }
# A library that is not the module (no entry point) is refused by name.
if TROUPE_CLUSTER_MODULE="$(ldconfig -p | awk '/libz.so.1 /{print $NF; exit}')" "$troupe" certs init --dir "$dir/c3" 2>"$dir/err"; then
  echo "a foreign library was accepted as the module"; exit 1
fi
grep -q 'no troupe_cluster_module' "$dir/err" || { cat "$dir/err"; exit 1; }
echo "cluster module test passed"

#!/usr/bin/env python3
"""Reads the include lines of every source file and fails on an include that breaks the layering in
tools/layers.txt: a project header from a layer the including layer may not use, or a heavy
third-party header (CAF, Cap'n Proto, CUDA) outside the layers allowed to include it.
Usage: check_includes.py REPO_ROOT"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
allowed, system = {}, {}
for line in open(os.path.join(root, "tools/layers.txt")):
    words = line.split("#", 1)[0].split()
    if not words:
        continue
    if words[0] == "system":
        system[words[1]] = set(words[2:])
    else:
        allowed[words[0]] = set(words[1:])
heavy = {"caf", "capnp", "kj", "gloo", "nccl", "cuda", "cublas", "cublasLt"}


def layer_of(path):
    best = None
    for layer in allowed:
        if path == layer or path.startswith(layer + "/"):
            if best is None or len(layer) > len(best):
                best = layer
    return best


def heavy_of(header):
    first = header.split("/", 1)[0].split(".", 1)[0]
    if first in ("caf", "capnp", "kj", "gloo"):
        return first
    if header.startswith("cuda") or header in ("cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h"):
        return "cuda"
    if header.startswith("cublasLt"):
        return "cublasLt"
    if header.startswith("cublas"):
        return "cublas"
    if header.startswith("nccl"):
        return "nccl"
    return None


include = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
problems, files = [], 0
for top in sorted({layer.split("/", 1)[0] for layer in allowed}):
    if not os.path.isdir(os.path.join(root, top)):
        continue
    for d, _, names in os.walk(os.path.join(root, top)):
        for n in names:
            if not n.endswith((".cpp", ".hpp", ".h", ".cu", ".cuh")):
                continue
            path = os.path.relpath(os.path.join(d, n), root)
            src = layer_of(path)
            if src is None:
                continue
            files += 1
            text = open(os.path.join(root, path), errors="replace").read()
            for m in include.finditer(text):
                kind, header = m.group(1), m.group(2)
                if kind == '"' and "/" in header and os.path.exists(os.path.join(root, header)):
                    dst = layer_of(header)
                    if dst is None or dst == src or "*" in allowed[src] or dst in allowed[src]:
                        continue
                    problems.append(f"{path}: includes {header} ({src} may not include {dst})")
                elif kind == "<":
                    h = heavy_of(header)
                    if h is None:
                        continue
                    ok = any(src == l or src.startswith(l + "/") for l, hs in system.items() if h in hs)
                    if not ok and "*" not in allowed[src]:
                        problems.append(f"{path}: includes <{header}> ({h} is not for {src})")
for p in problems:
    print(p)
print(f"{files} files read, {len(problems)} include(s) breaking the layering")
sys.exit(1 if problems else 0)

#!/usr/bin/python3
"""Trains troupe's embedded default model: a small Llama-architecture decoder on the King James Bible.

The corpus is Debian's bible-kjv-text package (the 1611 translation is in the public domain; the package's
retrieval program is GPL-2+), read through its `bible` program. The script trains a byte-level BPE
tokenizer in the Llama 3 style (its split regex, ignore_merges), trains the model with PyTorch on the
CPUs, and exports it twice: a Hugging Face directory (config.json, model.safetensors in f16,
tokenizer.json, tokenizer_config.json with a chat template, generation_config.json) and a GGUF file in
llama.cpp's layout (Q and K rows permuted for its RoPE, tokenizer.ggml.pre = "llama-bpe"). Users never
run this: the outputs are committed under models/. tools/train-default-model installs what it needs.

Each verse is one document: <|begin_of_text|> verse <|end_of_text|>. Every 50th verse is held out.
"""
import argparse
import collections
import json
import math
import os
import random
import struct
import subprocess
import time

import regex
import torch
import torch.nn as nn
import torch.nn.functional as F

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' or message['role'] == 'system' %}{{ message['content'] | trim }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + (message['content'] | trim) + eos_token }}"
    "{% endif %}{% endfor %}")


# ----------------------------------------------------------------------------------------------- corpus
def read_verses():
    out = subprocess.run(["bible", "-l", "100000", "gen1:1-rev22:21"], check=True, capture_output=True, text=True)
    verses = []
    for line in out.stdout.splitlines():
        m = regex.match(r"^\s+\d+ (.*)$", line)
        if m:
            verses.append(" ".join(m.group(1).split()))
    if len(verses) != 31102:
        raise SystemExit(f"expected the 31102 verses of the KJV, read {len(verses)}")
    return verses


# -------------------------------------------------------------------------------------------- tokenizer
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_CHAR = bytes_to_unicode()


def pieces(text):
    return [p for p in regex.findall(LLAMA3_SPLIT, text)]


def to_symbols(piece):
    return "".join(BYTE_CHAR[b] for b in piece.encode("utf-8"))


def train_bpe(texts, n_merges):
    words = collections.Counter()
    for t in texts:
        for p in pieces(t):
            words[to_symbols(p)] += 1
    seqs = {w: list(w) for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, s in seqs.items():
            f = words[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += f
        if not pairs:
            break
        # Highest count; ties broken by the pair itself so the result does not depend on hash order.
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        for w, s in seqs.items():
            if len(s) < 2:
                continue
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == best[0] and s[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.merges = merges
        self.rank = {m: i for i, m in enumerate(merges)}
        self.vocab = {}
        for b in range(256):
            self.vocab[BYTE_CHAR[b]] = len(self.vocab)
        for a, b in merges:
            self.vocab.setdefault(a + b, len(self.vocab))
        self.bos = len(self.vocab)
        self.eos = self.bos + 1
        self.size = self.eos + 1
        self.cache = {}

    def encode_piece(self, sym):
        if sym in self.vocab:  # ignore_merges: a whole piece in the vocabulary is one token
            return [self.vocab[sym]]
        if sym in self.cache:
            return self.cache[sym]
        s = list(sym)
        while len(s) > 1:
            best = min(((self.rank.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(s, s[1:]))))
            if best[0] == 1 << 30:
                break
            i = best[1]
            s = s[:i] + [s[i] + s[i + 1]] + s[i + 2:]
        ids = [self.vocab[x] for x in s]
        self.cache[sym] = ids
        return ids

    def encode(self, text):
        ids = []
        for p in pieces(text):
            ids += self.encode_piece(to_symbols(p))
        return ids

    def decode(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        back = {c: b for b, c in BYTE_CHAR.items()}
        out = bytearray()
        for i in ids:
            if i < self.bos:
                out += bytes(back[c] for c in inv[i])
        return out.decode("utf-8", errors="replace")

    def tokens(self):
        inv = [None] * self.size
        for k, v in self.vocab.items():
            inv[v] = k
        inv[self.bos], inv[self.eos] = BOS, EOS
        return inv


# ------------------------------------------------------------------------------------------------ model
class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, n, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    f = torch.outer(torch.arange(n).float(), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.q_proj = nn.Linear(d, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.gate_proj = nn.Linear(d, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(d, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        y = att.softmax(-1) @ v
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        cos, sin = rope_tables(c["head_dim"], c["max_position_embeddings"], c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
        for b in self.layers:  # scaled residual projections (GPT-2)
            nn.init.normal_(b.o_proj.weight, std=0.02 / math.sqrt(2 * c["num_hidden_layers"]))
            nn.init.normal_(b.down_proj.weight, std=0.02 / math.sqrt(2 * c["num_hidden_layers"]))

    def forward(self, ids):
        T = ids.shape[1]
        x = self.embed_tokens(ids)
        mask = torch.full((T, T), float("-inf")).triu(1)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.layers:
            x = b(x, cos, sin, mask)
        return self.norm(x) @ self.embed_tokens.weight.t()  # tied output head


# ----------------------------------------------------------------------------------------------- export
def safetensors_bytes(tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        b = t.contiguous().numpy().tobytes()
        dtype = {torch.float16: "F16", torch.float32: "F32"}[t.dtype]
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, GGUF_ARR = 4, 5, 6, 7, 8, 9


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, value):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == GGUF_ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        for it in items:
            out += gguf_value(etype, it)
    else:
        out += gguf_value(vtype, value)
    return out


def gguf_value(vtype, v):
    if vtype == GGUF_U32:
        return struct.pack("<I", v)
    if vtype == GGUF_I32:
        return struct.pack("<i", v)
    if vtype == GGUF_F32:
        return struct.pack("<f", v)
    if vtype == GGUF_BOOL:
        return struct.pack("<B", 1 if v else 0)
    if vtype == GGUF_STR:
        return gguf_str(v)
    raise ValueError(vtype)


def permute_rope_rows(w, n_head):
    # llama.cpp's convert_hf_to_gguf.py: HF rotates halves, ggml rotates adjacent pairs.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_bytes(c, tok, named, name):
    kvs = [
        gguf_kv("general.architecture", GGUF_STR, "llama"),
        gguf_kv("general.name", GGUF_STR, name),
        gguf_kv("general.license", GGUF_STR, "public-domain"),
        gguf_kv("general.file_type", GGUF_U32, 1),
        gguf_kv("general.alignment", GGUF_U32, 32),
        gguf_kv("llama.context_length", GGUF_U32, c["max_position_embeddings"]),
        gguf_kv("llama.embedding_length", GGUF_U32, c["hidden_size"]),
        gguf_kv("llama.block_count", GGUF_U32, c["num_hidden_layers"]),
        gguf_kv("llama.feed_forward_length", GGUF_U32, c["intermediate_size"]),
        gguf_kv("llama.attention.head_count", GGUF_U32, c["num_attention_heads"]),
        gguf_kv("llama.attention.head_count_kv", GGUF_U32, c["num_key_value_heads"]),
        gguf_kv("llama.rope.freq_base", GGUF_F32, float(c["rope_theta"])),
        gguf_kv("llama.rope.dimension_count", GGUF_U32, c["head_dim"]),
        gguf_kv("llama.attention.layer_norm_rms_epsilon", GGUF_F32, float(c["rms_norm_eps"])),
        gguf_kv("llama.vocab_size", GGUF_U32, c["vocab_size"]),
        gguf_kv("tokenizer.ggml.model", GGUF_STR, "gpt2"),
        gguf_kv("tokenizer.ggml.pre", GGUF_STR, "llama-bpe"),
        gguf_kv("tokenizer.ggml.tokens", GGUF_ARR, (GGUF_STR, tok.tokens())),
        gguf_kv("tokenizer.ggml.token_type", GGUF_ARR,
                (GGUF_I32, [1] * tok.bos + [3, 3])),
        gguf_kv("tokenizer.ggml.merges", GGUF_ARR, (GGUF_STR, [a + " " + b for a, b in tok.merges])),
        gguf_kv("tokenizer.ggml.bos_token_id", GGUF_U32, tok.bos),
        gguf_kv("tokenizer.ggml.eos_token_id", GGUF_U32, tok.eos),
        gguf_kv("tokenizer.ggml.add_bos_token", GGUF_BOOL, True),
        gguf_kv("tokenizer.ggml.add_eos_token", GGUF_BOOL, False),
        gguf_kv("tokenizer.chat_template", GGUF_STR, CHAT_TEMPLATE),
    ]
    infos, blobs, off = [], [], 0
    for gname, t in named:
        b = t.contiguous().numpy().tobytes()
        ggml_type = {torch.float32: 0, torch.float16: 1}[t.dtype]
        dims = list(reversed(t.shape))  # ggml's ne[0] is the innermost (row length)
        infos.append(gguf_str(gname) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
                     + struct.pack("<IQ", ggml_type, off))
        pad = (32 - len(b) % 32) % 32
        blobs.append(b + b"\0" * pad)
        off += len(b) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(named), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * ((32 - len(head) % 32) % 32)
    return head + b"".join(blobs)


def export(model, tok, out_dir, name, report):
    c = model.c
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    f16 = lambda t: t.to(torch.float16)
    hf, gg = [], [("token_embd.weight", f16(sd["embed_tokens.weight"]))]
    hf.append(("model.embed_tokens.weight", f16(sd["embed_tokens.weight"])))
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        hf += [
            (f"model.layers.{i}.input_layernorm.weight", f16(sd[p + "input_layernorm.weight"])),
            (f"model.layers.{i}.self_attn.q_proj.weight", f16(sd[p + "q_proj.weight"])),
            (f"model.layers.{i}.self_attn.k_proj.weight", f16(sd[p + "k_proj.weight"])),
            (f"model.layers.{i}.self_attn.v_proj.weight", f16(sd[p + "v_proj.weight"])),
            (f"model.layers.{i}.self_attn.o_proj.weight", f16(sd[p + "o_proj.weight"])),
            (f"model.layers.{i}.post_attention_layernorm.weight", f16(sd[p + "post_attention_layernorm.weight"])),
            (f"model.layers.{i}.mlp.gate_proj.weight", f16(sd[p + "gate_proj.weight"])),
            (f"model.layers.{i}.mlp.up_proj.weight", f16(sd[p + "up_proj.weight"])),
            (f"model.layers.{i}.mlp.down_proj.weight", f16(sd[p + "down_proj.weight"])),
        ]
        # Norm weights stay f32 in GGUF (llama.cpp's converter does the same); they hold the f16-rounded
        # values, so both files describe the same model.
        gg += [
            (f"blk.{i}.attn_norm.weight", f16(sd[p + "input_layernorm.weight"]).float()),
            (f"blk.{i}.attn_q.weight", f16(permute_rope_rows(sd[p + "q_proj.weight"], c["num_attention_heads"]))),
            (f"blk.{i}.attn_k.weight", f16(permute_rope_rows(sd[p + "k_proj.weight"], c["num_key_value_heads"]))),
            (f"blk.{i}.attn_v.weight", f16(sd[p + "v_proj.weight"])),
            (f"blk.{i}.attn_output.weight", f16(sd[p + "o_proj.weight"])),
            (f"blk.{i}.ffn_norm.weight", f16(sd[p + "post_attention_layernorm.weight"]).float()),
            (f"blk.{i}.ffn_gate.weight", f16(sd[p + "gate_proj.weight"])),
            (f"blk.{i}.ffn_up.weight", f16(sd[p + "up_proj.weight"])),
            (f"blk.{i}.ffn_down.weight", f16(sd[p + "down_proj.weight"])),
        ]
    hf.append(("model.norm.weight", f16(sd["norm.weight"])))
    gg.append(("output_norm.weight", f16(sd["norm.weight"]).float()))

    hf_dir = os.path.join(out_dir, name)
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, "model.safetensors"), "wb") as f:
        f.write(safetensors_bytes(hf))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float16",
        "bos_token_id": tok.bos, "eos_token_id": tok.eos, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1,
        "rope_scaling": None, "use_cache": True, "transformers_version": "4.46.0",
        **{k: c[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                             "rms_norm_eps", "rope_theta", "tie_word_embeddings")},
    }
    json.dump(config, open(os.path.join(hf_dir, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": tok.bos, "eos_token_id": tok.eos, "do_sample": True, "temperature": 0.8,
               "top_p": 0.95, "max_new_tokens": 64, "transformers_version": "4.46.0"},
              open(os.path.join(hf_dir, "generation_config.json"), "w"), indent=2)
    special = lambda i, s: {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True}
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(tok.bos, BOS), special(tok.eos, EOS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [tok.bos], "tokens": [BOS]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {k: v for k, v in sorted(tok.vocab.items(), key=lambda kv: kv[1])},
                  "merges": [a + " " + b for a, b in tok.merges]},
    }
    json.dump(tj, open(os.path.join(hf_dir, "tokenizer.json"), "w"), ensure_ascii=False)
    json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False,
               "clean_up_tokenization_spaces": False, "model_max_length": c["max_position_embeddings"],
               "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
               "added_tokens_decoder": {str(tok.bos): special(tok.bos, BOS), str(tok.eos): special(tok.eos, EOS)}},
              open(os.path.join(hf_dir, "tokenizer_config.json"), "w"), indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, name + ".gguf"), "wb") as f:
        f.write(gguf_bytes(c, tok, gg, name))
    json.dump(report, open(os.path.join(out_dir, name + ".training.json"), "w"), indent=2)


def write_eval_files(verses, out_dir, name):
    """What troupe's tests check the model against: the held-out verses (one a line) and every word of
    the corpus (one a line, sorted), so a test can say the model writes the corpus's words."""
    with open(os.path.join(out_dir, name + ".heldout.txt"), "w") as f:
        for i, v in enumerate(verses):
            if i % 50 == 49:
                f.write(v + "\n")
    words = sorted({w for v in verses for w in regex.findall(r"\p{L}+", v)})
    with open(os.path.join(out_dir, name + ".words.txt"), "w") as f:
        f.write("\n".join(words) + "\n")


# ------------------------------------------------------------------------------------------------ train
def batches(stream, block, batch, gen):
    n = (len(stream) - 1) // block
    while True:
        order = torch.randperm(n, generator=gen)
        for i in range(0, n - batch + 1, batch):
            rows = [stream[j * block: j * block + block + 1] for j in order[i:i + batch].tolist()]
            t = torch.tensor(rows)
            yield t[:, :-1], t[:, 1:]


@torch.no_grad()
def evaluate(model, stream, block):
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(stream) - 1 - block, block):
        t = torch.tensor([stream[i:i + block + 1]])
        logits = model(t[:, :-1])
        total += F.cross_entropy(logits.view(-1, logits.shape[-1]), t[0, 1:], reduction="sum").item()
        count += block
    model.train()
    return total / count


@torch.no_grad()
def greedy(model, tok, prompt, n):
    model.eval()
    ids = [tok.bos] + tok.encode(prompt)
    out = []
    for _ in range(n):
        nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
        if nxt == tok.eos:
            break
        ids.append(nxt)
        out.append(nxt)
    model.train()
    return tok.decode(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models")
    ap.add_argument("--name", default="troupe-kjv")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1611)
    ap.add_argument("--probe", type=int, default=0, help="time this many steps and stop")
    ap.add_argument("--eval-files-only", action="store_true", help="write the held-out verses and word list only")
    a = ap.parse_args()
    if a.eval_files_only:
        write_eval_files(read_verses(), a.out, a.name)
        return
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    torch.set_num_threads(os.cpu_count() or 1)
    t_start = time.time()

    verses = read_verses()
    train_v = [v for i, v in enumerate(verses) if i % 50 != 49]
    held_v = [v for i, v in enumerate(verses) if i % 50 == 49]
    t0 = time.time()
    merges = train_bpe(train_v, a.vocab - 256 - 2)
    tok = Tokenizer(merges)
    assert tok.size == a.vocab, (tok.size, a.vocab)
    print(f"tokenizer: {len(merges)} merges in {time.time() - t0:.0f} s", flush=True)

    def stream(vs):
        s = []
        for v in vs:
            s += [tok.bos] + tok.encode(v) + [tok.eos]
        return s
    train_s, held_s = stream(train_v), stream(held_v)
    print(f"corpus: {len(train_v)} training verses ({len(train_s)} tokens), {len(held_v)} held out "
          f"({len(held_s)} tokens)", flush=True)

    c = {"vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
         "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.hidden // a.heads,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}
    model = Llama(c)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed)
    it = batches(train_s, a.block, a.batch, gen)
    warm = max(1, a.steps // 20)
    steps = a.probe or a.steps
    t0 = time.time()
    for step in range(1, steps + 1):
        lr = a.lr * min(step / warm, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / a.steps))))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = next(it)
        loss = F.cross_entropy(model(x).view(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps:
            dt = time.time() - t0
            print(f"step {step}/{steps} loss {loss.item():.3f} lr {lr:.2e} "
                  f"{step * a.batch * a.block / dt:.0f} tok/s {dt:.0f} s", flush=True)
    if a.probe:
        return
    held = evaluate(model, held_s, a.block)
    train_loss = evaluate(model, train_s[: len(held_s)], a.block)
    print(f"held-out loss {held:.3f} (perplexity {math.exp(held):.1f}); training-sample loss {train_loss:.3f}")
    prompts = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the",
               "And Jesus answered and said unto them", "For God so loved the world"]
    samples = {p: greedy(model, tok, p, 48) for p in prompts}
    for p, s in samples.items():
        print(f"  {p} -> {s}")
    report = {
        "corpus": "Debian package bible-kjv-text 4.38 (King James Version, public domain), 31102 verses",
        "held_out": "every 50th verse", "training_tokens": len(train_s), "held_out_tokens": len(held_s),
        "tokenizer": {"type": "byte-level BPE, Llama 3 split regex, ignore_merges", "vocab": a.vocab},
        "config": c, "parameters": n_params, "steps": a.steps, "batch": a.batch, "block": a.block, "lr": a.lr,
        "seed": a.seed, "epochs": a.steps * a.batch * a.block / len(train_s),
        "held_out_loss": held, "held_out_perplexity": math.exp(held), "training_sample_loss": train_loss,
        "train_seconds": time.time() - t0, "total_seconds": time.time() - t_start,
        "torch": torch.__version__, "threads": torch.get_num_threads(), "greedy_samples": samples,
    }
    export(model, tok, a.out, a.name, report)
    write_eval_files(verses, a.out, a.name)
    print(f"wrote {a.out}/{a.name}/ and {a.out}/{a.name}.gguf in {time.time() - t_start:.0f} s total")


if __name__ == "__main__":
    main()

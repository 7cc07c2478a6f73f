"""Small GGUF files for tests: any tensors, and tiny random models of each architecture."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from glimmer_cupy.model.tokenizer import bytes_to_unicode
from glimmer_cupy.weights.quant_tensor import QType
from glimmer_cupy.weights.random_blocks import random_blocks


def write_gguf(path: Path, arch: str, metadata: dict, tensors: dict[str, tuple[QType, np.ndarray, tuple]]) -> Path:
    """tensors: name -> (type, raw data, logical shape (rows, cols) or (n,))."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
    for name, (qtype, data, shape) in tensors.items():
        w.add_tensor(name, data, raw_shape=data.shape if qtype in (QType.F32, QType.F16) else None,
                     raw_dtype=qtype if qtype not in (QType.F32, QType.F16) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def byte_vocab(n: int) -> tuple[list[str], list[int]]:
    """A GPT-2 style vocabulary of n tokens: the 256 byte symbols, fillers, then 2 control tokens."""
    tokens = list(bytes_to_unicode().values()) + ["Ġt"] + [f"tok{i}" for i in range(n - 256 - 3)] + ["<|endoftext|>", "<|im_end|>"]
    types = [1] * (n - 2) + [3, 3]
    return tokens, types


TINY = dict(hidden=64, ffn=96, layers=3, heads=4, kv_heads=2, head_dim=32, vocab=320)


def tiny_model(path: Path, arch: str, qtype: QType = QType.Q8_0, seed: int = 0) -> Path:
    """A random model of `arch` small enough for exact tests (hidden 64, 3 layers, GQA 4/2)."""
    c = TINY
    rng = np.random.default_rng(seed)
    h, hd, nh, nkv = c["hidden"], c["head_dim"], c["heads"], c["kv_heads"]
    tokens, types = byte_vocab(c["vocab"])
    meta = {
        f"{arch}.block_count": c["layers"], f"{arch}.embedding_length": h,
        f"{arch}.feed_forward_length": c["ffn"], f"{arch}.attention.head_count": nh,
        f"{arch}.attention.head_count_kv": nkv, f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd, f"{arch}.context_length": 256,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, f"{arch}.rope.freq_base": 10000.0,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["Ġ t"],
        "tokenizer.ggml.bos_token_id": c["vocab"] - 2, "tokenizer.ggml.eos_token_id": c["vocab"] - 1,
    }
    if arch == "gemma3":
        meta[f"{arch}.attention.sliding_window"] = 4
    ffn_type = QType.Q8_0 if qtype in (QType.Q8_0,) else qtype

    def mat(rows, cols, q=qtype, std=0.15):
        return (q, random_blocks(q, rows, cols, rng, std), (rows, cols))

    def vec(n, mean=1.0):
        return (QType.F32, rng.normal(mean, 0.1, n).astype(np.float32), (n,))

    t = {"token_embd.weight": mat(c["vocab"], h, QType.Q8_0, 1.0), "output_norm.weight": vec(h)}
    if arch in ("llama", "qwen2"):
        t["output.weight"] = mat(c["vocab"], h, QType.Q8_0, 0.2)
    for i in range(c["layers"]):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = vec(h)
        t[p + "attn_q.weight"] = mat(nh * hd, h)
        t[p + "attn_k.weight"] = mat(nkv * hd, h)
        t[p + "attn_v.weight"] = mat(nkv * hd, h, QType.Q8_0 if arch == "gemma3" else qtype)
        t[p + "attn_output.weight"] = mat(h, nh * hd)
        t[p + "ffn_norm.weight"] = vec(h)
        t[p + "ffn_gate.weight"] = mat(c["ffn"], h, ffn_type)
        t[p + "ffn_up.weight"] = mat(c["ffn"], h, ffn_type)
        t[p + "ffn_down.weight"] = mat(h, c["ffn"], ffn_type)
        if arch in ("qwen3", "gemma3"):
            t[p + "attn_q_norm.weight"] = vec(hd)
            t[p + "attn_k_norm.weight"] = vec(hd)
        if arch == "qwen2":
            t[p + "attn_q.bias"] = vec(nh * hd, 0.0)
            t[p + "attn_k.bias"] = vec(nkv * hd, 0.0)
            t[p + "attn_v.bias"] = vec(nkv * hd, 0.0)
        if arch == "gemma3":
            t[p + "post_attention_norm.weight"] = vec(h)
            t[p + "post_ffw_norm.weight"] = vec(h)
    return write_gguf(path, arch, meta, t)

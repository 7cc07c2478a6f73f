"""Model weights: GGUF tensor names -> the graph's named, joined weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import GGUFError
from ..weights.gguf_file import GGUFFile
from ..weights.quant_tensor import QuantTensor
from .config import ModelConfig
from .linear import Linear


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    qkv: Linear                       # q, k, v joined
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    wo: Linear
    post_attn_norm: np.ndarray | None
    ffn_norm: np.ndarray
    gate_up: Linear                   # gate, up joined
    down: Linear
    post_ffn_norm: np.ndarray | None


@dataclass
class ModelWeights:
    embed: QuantTensor
    layers: list[LayerWeights]
    out_norm: np.ndarray
    head: Linear

    @property
    def nbytes(self) -> int:
        per_layer = sum(l.qkv.nbytes + l.wo.nbytes + l.gate_up.nbytes + l.down.nbytes for l in self.layers)
        return self.embed.nbytes + per_layer + self.head.nbytes


def load_weights(f: GGUFFile, cfg: ModelConfig) -> ModelWeights:
    t = f.tensors

    def get(name: str, shape: tuple[int, ...]) -> QuantTensor:
        if name not in t:
            raise GGUFError(f"{f.path}: tensor {name} is missing")
        if t[name].shape != shape:
            raise GGUFError(f"{f.path}: tensor {name} has shape {t[name].shape}, the config needs {shape}")
        return t[name]

    def vec(name: str, n: int) -> np.ndarray:
        return get(name, (n,)).dequantize()

    def opt_vec(name: str, n: int, present: bool) -> np.ndarray | None:
        return vec(name, n) if present else None

    h, hd = cfg.hidden, cfg.head_dim
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        biases = None
        if cfg.qkv_bias:
            biases = [vec(p + "attn_q.bias", cfg.q_dim), vec(p + "attn_k.bias", cfg.kv_dim),
                      vec(p + "attn_v.bias", cfg.kv_dim)]
        layers.append(LayerWeights(
            attn_norm=vec(p + "attn_norm.weight", h),
            qkv=Linear(p + "attn_qkv", [get(p + "attn_q.weight", (cfg.q_dim, h)),
                                        get(p + "attn_k.weight", (cfg.kv_dim, h)),
                                        get(p + "attn_v.weight", (cfg.kv_dim, h))], biases),
            q_norm=opt_vec(p + "attn_q_norm.weight", hd, cfg.qk_norm),
            k_norm=opt_vec(p + "attn_k_norm.weight", hd, cfg.qk_norm),
            wo=Linear(p + "attn_output", [get(p + "attn_output.weight", (h, cfg.q_dim))]),
            post_attn_norm=opt_vec(p + "post_attention_norm.weight", h, cfg.post_norms),
            ffn_norm=vec(p + "ffn_norm.weight", h),
            gate_up=Linear(p + "ffn_gate_up", [get(p + "ffn_gate.weight", (cfg.ffn, h)),
                                               get(p + "ffn_up.weight", (cfg.ffn, h))]),
            down=Linear(p + "ffn_down", [get(p + "ffn_down.weight", (h, cfg.ffn))]),
            post_ffn_norm=opt_vec(p + "post_ffw_norm.weight", h, cfg.post_norms),
        ))
    embed = get("token_embd.weight", (cfg.vocab, h))
    head = embed if cfg.tied_output else get("output.weight", (cfg.vocab, h))
    return ModelWeights(embed=embed, layers=layers, out_norm=vec("output_norm.weight", h),
                        head=Linear("output", [head]))

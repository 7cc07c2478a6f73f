"""ModelConfig: everything the decoder graph needs, read from GGUF metadata.

Architectures differ only in these fields, never in a copy of the graph:
  llama   — SiLU, normal (adjacent-pair) RoPE, untied or tied head
  qwen2   — as llama with q/k/v biases and NeoX RoPE
  qwen3   — NeoX RoPE, per-head q/k RMSNorm
  gemma3  — GELU(tanh), NeoX RoPE, q/k norm, post-attention and post-FFN norms, embeddings
            scaled by sqrt(hidden), sliding-window layers (5 of every 6) with their own rope base
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import GGUFError, UnsupportedError
from ..weights.gguf_file import GGUFFile

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")

# Gemma 3's local layers use rope base 10000 whatever the global base; the GGUF files carry
# no key for it (llama.cpp hard-codes the same value).
GEMMA3_LOCAL_ROPE_BASE = 10_000.0
GEMMA3_SWA_PERIOD = 6          # layer i is global when (i + 1) % 6 == 0


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rms_eps: float
    rope_base: float
    rope_neox: bool
    rope_dim: int
    activation: str                   # "silu" | "gelu"
    qk_norm: bool = False
    post_norms: bool = False
    qkv_bias: bool = False
    embed_scale: float = 1.0
    sliding_window: int = 0           # 0: no sliding-window layers
    swa_period: int = 0               # layer i slides unless (i + 1) % swa_period == 0
    rope_base_local: float = 0.0      # rope base of sliding-window layers
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    tied_output: bool = False

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def is_sliding(self, layer: int) -> bool:
        return bool(self.sliding_window) and (layer + 1) % self.swa_period != 0

    def window(self, layer: int) -> int:
        return self.sliding_window if self.is_sliding(layer) else 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_local if self.is_sliding(layer) else self.rope_base

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModelConfig":
        arch = f.architecture
        if arch not in ARCHITECTURES:
            raise UnsupportedError(f"{f.path}: architecture {arch!r} is not supported "
                                   f"(supported: {', '.join(ARCHITECTURES)})")

        def key(name, default=None, required=True):
            v = f.get(f"{arch}.{name}", default)
            if v is None and required:
                raise GGUFError(f"{f.path}: metadata key {arch}.{name} is missing")
            return v

        hidden = int(key("embedding_length"))
        n_heads = int(key("attention.head_count"))
        n_kv = int(key("attention.head_count_kv", n_heads))
        head_dim = int(key("attention.key_length", hidden // n_heads))
        if int(key("attention.value_length", head_dim)) != head_dim:
            raise UnsupportedError(f"{f.path}: key and value head sizes differ")
        if n_heads % n_kv:
            raise GGUFError(f"{f.path}: {n_heads} query heads do not group over {n_kv} KV heads")
        scaling = f.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", None) or "rope_freqs.weight" in f.tensors:
            raise UnsupportedError(f"{f.path}: rope scaling ({scaling}) is not supported")
        emb = f.tensors.get("token_embd.weight")
        if emb is None:
            raise GGUFError(f"{f.path}: tensor token_embd.weight is missing")
        common = dict(
            arch=arch, n_layers=int(key("block_count")), hidden=hidden, ffn=int(key("feed_forward_length")),
            n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, vocab=emb.shape[0],
            context=int(key("context_length")), rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            rope_base=float(key("rope.freq_base", 10000.0)), rope_dim=int(key("rope.dimension_count", head_dim)),
            tied_output="output.weight" not in f.tensors,
        )
        if arch == "llama":
            return cls(**common, rope_neox=False, activation="silu")
        if arch == "qwen2":
            return cls(**common, rope_neox=True, activation="silu", qkv_bias=True)
        if arch == "qwen3":
            return cls(**common, rope_neox=True, activation="silu", qk_norm=True)
        # gemma3
        return cls(**common, rope_neox=True, activation="gelu", qk_norm=True, post_norms=True,
                   embed_scale=math.sqrt(hidden), sliding_window=int(key("attention.sliding_window", 0)),
                   swa_period=GEMMA3_SWA_PERIOD, rope_base_local=GEMMA3_LOCAL_ROPE_BASE,
                   attn_softcap=float(key("attn_logit_softcapping", 0.0, required=False) or 0.0),
                   final_softcap=float(key("final_logit_softcapping", 0.0, required=False) or 0.0))

"""The decoder graph, written once over glimmer_cupy.ops for every supported architecture.

One graph for both array types: with NumPy weights, step arrays and KV pools it runs the
reference ops (runtime/host_executor.py); with device weights (CuPy norm vectors, device
QuantTensors), step arrays on the device and bf16 pools it launches the kernels
(runtime/cuda_executor.py). Nothing here names an array module: Linear joins and splits
with the module of its input, and ops dispatch on the array type.
"""

from __future__ import annotations

from .. import ops
from .config import ModelConfig
from .linear import array_module
from .step import StepBatch
from .weights import ModelWeights


class Decoder:
    """forward(step, kv) -> logits for the step's logit rows; kv[layer] = (k_pool, v_pool).

    The step's arrays, the pools and the weights are all NumPy or all CuPy."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights):
        self.cfg = cfg
        self.w = weights

    def forward(self, step: StepBatch, kv):
        cfg, w = self.cfg, self.w
        t = step.n_tokens
        x = ops.embed(w.embed, step.tokens, cfg.embed_scale)                     # x: (T, hidden)
        # q8: on the GPU, a norm or activation that feeds a matmul also makes the int8 form its
        # small-step GEMV reads (ops/q8.py); the NumPy path ignores it
        h = ops.rms_norm(x, w.layers[0].attn_norm, cfg.rms_eps, q8=True)
        for i, lw in enumerate(w.layers):
            k_pool, v_pool = kv[i]
            q = ops.prepare_qkv_(lw.qkv(h), k_pool, v_pool, step.cells, step.positions, cfg.n_heads,   # (T, Hq, D)
                                 cfg.n_kv_heads, lw.q_norm if cfg.qk_norm else None,
                                 lw.k_norm if cfg.qk_norm else None, cfg.rms_eps, cfg.layer_rope_base(i),
                                 cfg.rope_neox, cfg.rope_dim)
            a = ops.attention(q, k_pool, v_pool, step.cell_table, step.seq_lens, step.tok_seq,
                              step.positions, cfg.attn_scale, cfg.window(i), cfg.attn_softcap, step.visible,
                              q8=True)
            o = lw.wo(a.reshape(t, cfg.q_dim))                                   # (T, hidden)
            if cfg.post_norms:
                o = ops.rms_norm(o, lw.post_attn_norm, cfg.rms_eps)
            x, h = _add_norm(x, o, lw.ffn_norm, cfg.rms_eps, lw.gate_up.makes_input(t))   # x + o
            gu = lw.gate_up(h)                                                   # (T, 2 ffn)
            act = _gated(gu, cfg.activation, lw.down.makes_input(t))
            d = lw.down(act)
            if cfg.post_norms:
                d = ops.rms_norm(d, lw.post_ffn_norm, cfg.rms_eps)
            if i + 1 < len(w.layers):
                nxt = w.layers[i + 1]
                x, h = _add_norm(x, d, nxt.attn_norm, cfg.rms_eps, nxt.qkv.makes_input(t))   # x + d
            else:
                h = ops.add_rms_norm_(x, d, w.out_norm, cfg.rms_eps)            # x += d, for the head
        if step.logit_rows.shape[0] == 0:                                    # a prefill chunk
            return array_module(h).zeros((0, cfg.vocab), dtype=h.dtype)
        logits = w.head(h[step.logit_rows])                                      # (K, vocab) float32
        if cfg.final_softcap:
            logits = ops.softcap(logits, cfg.final_softcap)
        return logits


def _add_norm(x, delta, weight, eps: float, fused: bool):
    """(x + delta, the next matmul's normed input). fused: the input is made by that matmul's GEMV
    (ops.norm_input: one launch less in a one-token step) and x + delta lands in a new array;
    else x is updated in place and the norm makes its int8 codes for the GEMV (q8)."""
    if fused:
        h = ops.norm_input(x, delta, weight, eps)
        return h.residual, h
    return x, ops.add_rms_norm_(x, delta, weight, eps, q8=True)


def _gated(gate_up, activation: str, fused: bool):
    """The down projection's input: act(gate) * up, made by its GEMV when fused (ops.gated_input)."""
    if fused:
        return ops.gated_input(gate_up, activation)
    return ops.gelu_mul(gate_up, q8=True) if activation == "gelu" else ops.silu_mul(gate_up, q8=True)

"""The decoder graph, written once over glimmer_cupy.ops for every supported architecture.

One graph for both array types: with NumPy weights, step arrays and KV pools it runs the
reference ops (runtime/host_executor.py); with device weights (CuPy norm vectors, device
QuantTensors), step arrays on the device and bf16 pools it launches the kernels
(runtime/cuda_executor.py). Nothing here names an array module: Linear joins and splits
with the module of its input, and ops dispatch on the array type.
"""

from __future__ import annotations

from .. import ops
from ..ops.prefetch import MAX_RANGES, L2Ranges, l2_ranges
from .config import ModelConfig
from .linear import Linear, array_module
from .step import StepBatch
from .weights import ModelWeights


# Bytes of a layer's weights that its decode attention asks to be brought into L2 as its pushing
# blocks leave (ops/prefetch.py): gate/up, then down, the matmuls after o (whose own weights are
# loaded before its wait). Only for layers whose gate/up holds at least L2_PREFETCH_MIN_GATE_UP
# bytes: there the DRAM is idle through attention's end and the o GEMV's; on small layers the same
# burst lands on the latency-bound chain that follows. Measured on an H100 (bench/ab_prefetch_model.py,
# bench/results/NOTES.md, sixty-second session): synthetic Qwen3-8B (56 MB of gate/up a layer)
# 4 MB -13.7 us a step over five rounds (6 MB -15.7, 2-3 MB none, 16 MB +20); synthetic
# Qwen3-0.6B (1.8 MB) 1 MB +23 us, 4 MB +44.
L2_PREFETCH_BYTES = 4 << 20
L2_PREFETCH_MIN_GATE_UP = 16 << 20


def prefetch_ranges(layers: list[Linear], budget: int) -> L2Ranges | None:
    """The first `budget` bytes of the layers' parts, in order, as at most MAX_RANGES ranges."""
    parts = []
    for layer in layers:
        for p in layer.parts:
            if budget <= 0 or len(parts) == MAX_RANGES:
                break
            parts.append((p, min(p.nbytes, budget)))
            budget -= p.nbytes
    return l2_ranges(*parts) if parts else None


class Decoder:
    """forward(step, kv) -> logits for the step's logit rows; kv[layer] = (k_pool, v_pool).

    The step's arrays, the pools and the weights are all NumPy or all CuPy."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights):
        self.cfg = cfg
        self.w = weights
        # the CUDA path's one-launch layer stack for one-token steps (model/fused_stack.py), where
        # the executor found the model one it serves
        self.stack = None
        self._l2: dict[tuple[int, int, int], L2Ranges | None] = {}

    def _prefetch(self, i: int) -> L2Ranges | None:
        """Layer i's L2 prefetch during its attention (L2_PREFETCH_BYTES where its gate/up is large
        enough), built once per setting."""
        key = (i, L2_PREFETCH_BYTES, L2_PREFETCH_MIN_GATE_UP)
        if key not in self._l2:
            lw = self.w.layers[i]
            big = sum(p.nbytes for p in lw.gate_up.parts) >= L2_PREFETCH_MIN_GATE_UP
            self._l2[key] = prefetch_ranges([lw.gate_up, lw.down], L2_PREFETCH_BYTES if big else 0)
        return self._l2[key]

    def forward(self, step: StepBatch, kv):
        cfg, w = self.cfg, self.w
        t = step.n_tokens
        x = ops.embed(w.embed, step.tokens, cfg.embed_scale)                     # x: (T, hidden)
        # a one-token step whose token asks for logits (one sequence's decode) has logit_rows [0]: the
        # head reads the final norm's row and its int8 codes as they are, with no gather of rows and no
        # quantization of x of its own (SmolLM2's step -7 µs, bench/results/NOTES.md)
        whole = t == 1 and step.logit_rows.shape[0] == 1
        if whole and self.stack is not None and self.stack.serves(step):
            return self._head(self.stack(x, step, kv), step, whole)
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
                              q8=True, prefetch=self._prefetch(i))
            o = lw.wo(a.reshape(t, cfg.q_dim))                                   # (T, hidden)
            if cfg.post_norms:
                o = ops.rms_norm(o, lw.post_attn_norm, cfg.rms_eps)
            h = ops.add_rms_norm_(x, o, lw.ffn_norm, cfg.rms_eps, q8=True)       # x += o
            gu = lw.gate_up(h)                                                   # (T, 2 ffn)
            act = ops.gelu_mul(gu, q8=True) if cfg.activation == "gelu" else ops.silu_mul(gu, q8=True)
            d = lw.down(act)
            if cfg.post_norms:
                d = ops.rms_norm(d, lw.post_ffn_norm, cfg.rms_eps)
            nxt = w.layers[i + 1].attn_norm if i + 1 < len(w.layers) else w.out_norm
            h = ops.add_rms_norm_(x, d, nxt, cfg.rms_eps, q8=i + 1 < len(w.layers) or whole)   # x += d
        return self._head(h, step, whole)

    def _head(self, h, step: StepBatch, whole: bool):
        """Logits of the step's logit rows from the final norm's rows h."""
        cfg, w = self.cfg, self.w
        if step.logit_rows.shape[0] == 0:                                    # a prefill chunk
            return array_module(h).zeros((0, cfg.vocab), dtype=h.dtype)
        logits = w.head(h if whole else h[step.logit_rows])                      # (K, vocab) float32
        if cfg.final_softcap:
            logits = ops.softcap(logits, cfg.final_softcap)
        return logits

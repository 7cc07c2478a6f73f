"""Every decoder layer of a one-token step in one launch (cuda_src/decode_stack.cu), for small models.

A one-token step of a small model is ~9 short kernels a layer whose cost is mostly the kernel
boundaries between them (SmolLM2-135M: 16.2 µs a layer, bench/results/NOTES.md). DecodeStack runs
all the layers in one cluster of CLUSTER blocks that exchange vectors through distributed shared
memory instead. It serves the models whose layers fit it (`why_not` says why one does not): one
small-block type for every layer matrix, head_dim 64, no q/k norms, biases, post norms, windows or
attention softcap, SiLU, and every matrix's rows dividing evenly over the cluster. Other models,
and every step that is not one token, run the decoder's ops as before.

Off by default (ENABLED): its first build measured correct and 2.2x slower than the ops on
SmolLM2-135M, its machine code too large for an SM to hold (bench/results/NOTES.md, the
thirty-seventh and thirty-eighth sessions); bench/probe_decode_stack.py shows where its layer time
goes.

The shared-memory layout is computed here, in one place, and handed to the kernel as byte offsets.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.build import get_kernel
from ..kernels.launch import allow_large_clusters, launch_cluster
from ..ops.matmul import TRAITS
from ..ops.q8 import Q8Rows
from ..weights.quant_tensor import QType, row_bytes
from .config import ModelConfig

CLUSTER = 16                   # blocks a cluster: the H200's largest (non-portable) cluster
THREADS = 256                  # kThreads in decode_stack.cu
WARPS = THREADS // 32
HEAD_DIM = 64
MAX_GROUP = 4                  # query heads a KV head: the kernel is instantiated for 1..4
SMEM_LIMIT = 227 * 1024        # dynamic shared memory a block may ask for on sm_90
TYPES = (QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q8_0)
N_BARS = 10                    # kBars
PART = 68                      # kPart: a head's partial (64 sums, m, l, padding)
COLS = 9                       # kCols: a layer's words in the table
ENABLED = False                # on: one-token steps of the models it serves run the stack (measured slower)

# kOffs order in decode_stack.cu
OFFSETS = ("wqkv", "wo", "wgu", "wd", "x", "qkv", "part", "att", "o", "act", "down", "rows", "xq", "xd", "xs",
           "warp", "prob", "red", "norm_a", "norm_f", "rope", "table", "cells", "bars")
MAX_CELLS = 2048               # cells of a block's positions kept in shared memory (more are read from the table)


def smem_layout(cfg: ModelConfig, qtype: QType, c: int = CLUSTER) -> tuple[list[int], int]:
    """(byte offset of each OFFSETS entry, total bytes) of a block's dynamic shared memory."""
    h, f, d = cfg.hidden, cfg.ffn, cfg.head_dim
    qd, kvd = cfg.q_dim, cfg.kv_dim
    widest = max(h, qd, f)
    own = -(-cfg.n_heads // c)                      # heads an owner block merges, at most
    rows = max((qd + 2 * kvd) // c, h // c, 2 * (f // c))
    sizes = dict(
        wqkv=(qd + 2 * kvd) // c * row_bytes(qtype, h), wo=h // c * row_bytes(qtype, qd),
        wgu=2 * (f // c) * row_bytes(qtype, h), wd=h // c * row_bytes(qtype, f),
        x=4 * h, qkv=4 * (qd + 2 * kvd), part=4 * c * own * PART, att=4 * qd, o=4 * h, act=4 * f,
        down=4 * h, rows=4 * rows, xq=widest, xd=4 * (widest // 32), xs=4 * (widest // 32),
        warp=4 * WARPS * MAX_GROUP * (d + 2), prob=4 * WARPS * 32, red=4 * WARPS, norm_a=2 * 4 * h,
        norm_f=2 * 4 * h, rope=4 * d, table=8 * COLS * cfg.n_layers,
        cells=4 * min(MAX_CELLS, -(-cfg.context // c)), bars=8 * N_BARS)
    offs, at = [], 0
    for name in OFFSETS:
        offs.append(at)
        at += -(-sizes[name] // 128) * 128          # bulk copies and vector loads want aligned starts
    return offs, at


def why_not(cfg: ModelConfig, layers, n_cells: int = 0) -> str | None:
    """Why DecodeStack cannot run these layers (LayerWeights with device parts) over KV pools of
    n_cells cells, or None."""
    if cfg.head_dim != HEAD_DIM:
        return f"head_dim {cfg.head_dim} (the stack's attention is laid out for {HEAD_DIM})"
    if cfg.qk_norm or cfg.post_norms or cfg.qkv_bias or cfg.attn_softcap or cfg.sliding_window:
        return "q/k norms, post norms, biases, an attention softcap or sliding windows"
    if cfg.activation != "silu" or (cfg.rope_dim or cfg.head_dim) != cfg.head_dim:
        return f"activation {cfg.activation} or a partial rope ({cfg.rope_dim} of {cfg.head_dim})"
    if cfg.n_heads % cfg.n_kv_heads or not 1 <= cfg.n_heads // cfg.n_kv_heads <= MAX_GROUP:
        return f"{cfg.n_heads} query heads over {cfg.n_kv_heads} KV heads"
    if cfg.n_kv_heads > WARPS:
        return f"{cfg.n_kv_heads} KV heads (a block has {WARPS} warps)"
    qtype = None
    for lw in layers:
        for lin in (lw.qkv, lw.wo, lw.gate_up, lw.down):
            if len(lin.parts) != 1:                 # (biases: cfg.qkv_bias, refused above)
                return f"{lin.parts[0].name} has {len(lin.parts)} parts of different types"
            t = lin.parts[0].qtype
            if t not in TYPES or (qtype is not None and t != qtype):
                return f"{lin.parts[0].name} is {t.name}"
            qtype = t
    c = CLUSTER
    for rows in (cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden, cfg.ffn):
        if rows % (4 * c):
            return f"{rows} rows do not split over {c} blocks in fours"
    for rows, k in ((cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden), (cfg.hidden, cfg.q_dim), (cfg.ffn, cfg.hidden),
                    (cfg.hidden, cfg.ffn)):
        if rows // c * row_bytes(qtype, k) % 16 or k % 32:
            return f"a block's rows of a {rows}x{k} matrix are not whole 16-byte pieces"
    words = n_cells * cfg.kv_dim // 2                # the kernel indexes a pool by 32-bit words
    if words >= 2 ** 32:
        return f"KV pools of {n_cells} cells ({words} 4-byte words) are beyond the kernel's 32-bit offsets"
    need = smem_layout(cfg, qtype)[1]
    if need > SMEM_LIMIT:
        return f"a block would need {need} bytes of shared memory (at most {SMEM_LIMIT})"
    return None


class DecodeStack:
    """stack(x, step, kv) -> Q8Rows of the final norm's row, for a one-token step (`serves`)."""

    def __init__(self, cfg: ModelConfig, weights, defines: dict | None = None):
        self.cfg, self.w = cfg, weights
        self.qtype = weights.layers[0].qkv.parts[0].qtype
        self.offsets, self.smem = smem_layout(cfg, self.qtype)
        self.defines = defines         # compile-time switches of the probe (decode_stack.cu: STACK_CHUNK)
        self.kern = None               # compiled at the first call: a stack that is off costs nothing
        self._table = None
        self._pools = None
        self.stamps = None             # a device uint64 array of CLUSTER x n_layers x 16 to fill (the probe's)

    def _kernel(self):
        if self.kern is None:
            import cupy
            cfg = self.cfg
            name = (f"decode_stack_kernel<gguf::{TRAITS[self.qtype]}, {cfg.head_dim}, "
                    f"{'true' if cfg.rope_neox else 'false'}, {cfg.n_heads // cfg.n_kv_heads}>")
            kern = get_kernel("decode_stack", name, defines=self.defines, name_expressions=(name,))
            allow_large_clusters(kern.fn)
            kern.fn.max_dynamic_shared_size_bytes = self.smem
            self.layout = cupy.asarray(np.array(self.offsets, np.int32))
            self.kern = kern
        return self.kern

    @classmethod
    def build(cls, cfg: ModelConfig, weights, n_cells: int = 0) -> DecodeStack | None:
        """A stack for these device weights and pools of n_cells cells, or None when it does not serve them."""
        return None if why_not(cfg, weights.layers, n_cells) else cls(cfg, weights)

    @staticmethod
    def serves(step) -> bool:
        """One token, no mask: the one-token decode step (its sequence's row of the cell table is read)."""
        return ENABLED and step.n_tokens == 1 and step.visible is None

    def table(self, kv):
        """The layers' pointers (uploaded once per set of pools)."""
        import cupy
        pools = tuple(int(p.data.ptr) for pair in kv for p in pair)
        if self._pools != pools:
            cfg = self.cfg
            t = np.zeros((cfg.n_layers, COLS), np.uint64)
            for i, (lw, (kp, vp)) in enumerate(zip(self.w.layers, kv)):
                ptrs = (lw.qkv.parts[0].data, lw.wo.parts[0].data, lw.gate_up.parts[0].data, lw.down.parts[0].data,
                        lw.attn_norm, lw.ffn_norm, kp, vp)
                t[i, :8] = [int(a.data.ptr) for a in ptrs]
                t[i, 8] = np.float64(math.log2(cfg.layer_rope_base(i))).view(np.uint64)
            self._table = cupy.asarray(t)
            self._pools = pools
        return self._table

    def __call__(self, x, step, kv) -> Q8Rows:
        import cupy
        cfg = self.cfg
        h = cfg.hidden
        kern = self._kernel()
        table = self.table(kv)
        out = cupy.empty((1, h), cupy.float32)
        xq = cupy.empty((1, h // 4), cupy.int32)
        xd = cupy.empty((1, h // 32), cupy.float32)
        xs = cupy.empty((1, h // 32), cupy.float32)
        args = (table, self.layout, np.int32(cfg.n_layers), np.int32(h), np.int32(cfg.n_heads),
                np.int32(cfg.n_kv_heads), np.int32(cfg.ffn), x, step.positions, step.cells, step.tok_seq,
                step.cell_table, np.int32(step.cell_table.shape[1]), step.seq_lens, self.w.out_norm,
                np.float32(cfg.rms_eps), np.float32(cfg.attn_scale), out, xq, xd, xs,
                np.uint64(0) if self.stamps is None else self.stamps)
        launch_cluster(kern, (CLUSTER,), (THREADS,), args, self.smem, (CLUSTER, 1, 1))
        return Q8Rows(out, xq, xd, xs)

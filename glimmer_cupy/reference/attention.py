"""Attention over the KV cell pool, and the KV write.

The pool holds K and V for every cell: (cells, kv_heads, head_dim). A step's tokens belong to
step-sequences; sequence s reads position j from cell cell_table[s, j]. Token t (sequence
tok_seq[t], position tok_pos[t]) sees position j when
    j < seq_lens[s]  and  j <= tok_pos[t]  and  (window == 0 or tok_pos[t] - j < window)
or, where `visible` (T, L) is given, when j < seq_lens[s] and visible[t, j] (a non-causal or
packed step states its visibility outright). A token that sees nothing gets zeros, not NaN.
Query head h reads KV head h // (q_heads // kv_heads) (GQA).
"""

import numpy as np


def kv_write_(k_pool: np.ndarray, v_pool: np.ndarray, k: np.ndarray, v: np.ndarray, cells: np.ndarray) -> None:
    """k_pool[cells[t]] = k[t], likewise v. k, v: (T, kv_heads, head_dim)."""
    k_pool[cells] = k
    v_pool[cells] = v


def visibility(cell_table, seq_lens, tok_seq, tok_pos, window=0, visible=None) -> np.ndarray:
    """(T, L) bool: which positions of its own sequence each token attends to."""
    L = cell_table.shape[1]
    j = np.arange(L)[None, :]
    pos = np.asarray(tok_pos)[:, None]
    inside = j < np.asarray(seq_lens)[np.asarray(tok_seq)][:, None]
    if visible is not None:
        return inside & np.asarray(visible, dtype=bool)
    mask = inside & (j <= pos)
    if window:
        mask &= pos - j < window
    return mask


def attention(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, scale,
              window=0, softcap=0.0, visible=None) -> np.ndarray:
    """q: (T, q_heads, D) -> (T, q_heads, D) float32; softmax in float64."""
    t, hq, d = q.shape
    hkv = k_pool.shape[1]
    group = hq // hkv
    mask = visibility(cell_table, seq_lens, tok_seq, tok_pos, window, visible)        # (T, L)
    out = np.zeros((t, hq, d), dtype=np.float32)
    for i in range(t):
        cols = np.nonzero(mask[i])[0]
        if cols.size == 0:
            continue
        cells = cell_table[tok_seq[i], cols]
        k = k_pool[cells].astype(np.float64)                                          # (n, hkv, D)
        v = v_pool[cells].astype(np.float64)
        qi = q[i].astype(np.float64).reshape(hkv, group, d)                           # (hkv, g, D)
        s = np.einsum("hgd,nhd->hgn", qi, k) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        s -= s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        out[i] = np.einsum("hgn,nhd->hgd", p, v).reshape(hq, d)
    return out


def prepare_qkv_(qkv: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, cells: np.ndarray,
                 positions: np.ndarray, n_heads: int, n_kv_heads: int, q_norm, k_norm, eps: float,
                 rope_base: float, neox: bool, rope_dim: int | None = None) -> np.ndarray:
    """From one matmul's q|k|v rows (T, (Hq + 2 Hkv) * D) to attention's inputs: q and k through the
    per-head RMSNorm (where q_norm, k_norm are given) and RoPE at `positions`, K and V written to
    their cells. Returns q (T, Hq, D)."""
    from .norm import rms_norm
    from .rope import rope

    t = qkv.shape[0]
    d = qkv.shape[1] // (n_heads + 2 * n_kv_heads)
    q_dim, kv_dim = n_heads * d, n_kv_heads * d
    q = qkv[:, :q_dim].reshape(t, n_heads, d)
    k = qkv[:, q_dim:q_dim + kv_dim].reshape(t, n_kv_heads, d)
    v = qkv[:, q_dim + kv_dim:].reshape(t, n_kv_heads, d)
    if q_norm is not None:
        q = rms_norm(q, q_norm, eps)
        k = rms_norm(k, k_norm, eps)
    q = rope(q, positions, rope_base, neox, rope_dim)
    k = rope(k, positions, rope_base, neox, rope_dim)
    kv_write_(k_pool, v_pool, k, v, cells)
    return q

"""Attention over the KV cell pool and the KV write (see reference/attention.py for the rules)."""

from ..reference import attention as ref
from ._dispatch import is_host, no_kernel


def kv_write_(k_pool, v_pool, k, v, cells):
    """k_pool[cells[t]] = k[t]; v_pool likewise."""
    if is_host(k_pool):
        return ref.kv_write_(k_pool, v_pool, k, v, cells)
    raise no_kernel("kv_write_", k_pool)


def attention(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, scale: float,
              window: int = 0, softcap: float = 0.0, visible=None):
    """q: (T, q_heads, D) -> (T, q_heads, D) over each token's own sequence's cells."""
    if is_host(q):
        return ref.attention(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, scale,
                             window, softcap, visible)
    raise no_kernel("attention", q)

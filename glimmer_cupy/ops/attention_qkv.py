"""A layer's attention from its qkv matmul's output: prepare_qkv_ (per-head q/k norm, RoPE, K/V
into the pool) then attention, as one op. On the GPU a one-token unmasked step can run
attn_stream_kernel alone, which makes the token's q, K and V itself with prepare_qkv's arithmetic
(cuda_src/attention_stream.cu, kPrepFused): the same outputs and pool contents, one kernel boundary
fewer. Measured on the H200 (synthetic Qwen3-0.6B decode, bench/results/NOTES.md, 745c76c) it is
slower than the two ops, 655.3 against 649.5 / 648.3 us a step: the prep on attention's critical
path costs more than prepare_qkv as a kernel of its own. So the two ops are the default and the
one kernel runs only when asked (fuse=True).
"""

from ..reference import attention as ref
from ._check import fail
from ._dispatch import host_result, is_host
from .attention import HEAD_DIMS, StreamPrep, attention
from .prepare_qkv import check_prepare, prepare_qkv_


def attention_qkv(qkv, k_pool, v_pool, cells, n_heads: int, n_kv_heads: int, q_norm, k_norm, eps: float,
                  rope_base: float, neox: bool, rope_dim, cell_table, seq_lens, tok_seq, tok_pos, scale: float,
                  window: int = 0, softcap: float = 0.0, visible=None, *, q8: bool = False, out=None, workspace=None,
                  fuse: bool | None = None):
    """prepare_qkv_(qkv, k_pool, v_pool, cells, tok_pos, ...) then attention(q, k_pool, v_pool,
    cell_table, seq_lens, tok_seq, tok_pos, scale, window, softcap, visible): the attention output
    (T, n_heads, D), K and V of the step written to their cells. fuse (tests, benchmarks): True
    asks for the one-kernel path (a one-token unmasked step whose rope covers the head); False and
    None (the default, by measurement) run the two ops."""
    if is_host(qkv):
        q = ref.prepare_qkv_(qkv, k_pool, v_pool, cells, tok_pos, n_heads, n_kv_heads, q_norm, k_norm, eps,
                             rope_base, neox, rope_dim)
        return host_result(ref.attention(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, scale, window,
                                         softcap, visible), out)
    op = "attention_qkv"
    d = check_prepare(qkv, k_pool, v_pool, cells, tok_pos, n_heads, n_kv_heads, q_norm, k_norm, op)
    t = qkv.shape[0]
    one_kernel = t == 1 and visible is None and d in HEAD_DIMS and (rope_dim or d) == d
    if fuse and not one_kernel:
        raise fail(op, "fuse", "a one-token unmasked step with the rope over the whole head",
                   f"{t} tokens, {'a' if visible is not None else 'no'} visibility mask, head_dim {d}, "
                   f"rope_dim {rope_dim or d}")
    if not fuse:
        q = prepare_qkv_(qkv, k_pool, v_pool, cells, tok_pos, n_heads, n_kv_heads, q_norm, k_norm, eps, rope_base,
                         neox, rope_dim)
        return attention(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, scale, window, softcap, visible,
                         q8=q8, out=out, workspace=workspace)
    q = qkv[:, :n_heads * d].reshape(t, n_heads, d)   # one row: contiguous; the kernel reads qkv itself
    prep = StreamPrep(qkv, q_norm, k_norm, cells, eps, rope_base, neox)
    return attention(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, scale, window, softcap, visible,
                     q8=q8, out=out, workspace=workspace, prep=prep)

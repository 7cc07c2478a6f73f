"""The NumPy references checked against independent formulations of the same math."""

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.reference.attention import attention, visibility

rng = np.random.default_rng(0)


def test_rms_norm_and_fused_add():
    x = rng.normal(0, 3, (7, 99)).astype(np.float32)
    w = rng.normal(1, 0.1, 99).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-6), want, rtol=1e-5)
    res, d = x.copy(), rng.normal(size=x.shape).astype(np.float32)
    out = ops.add_rms_norm_(res, d, w, 1e-6)
    np.testing.assert_allclose(res, x + d, rtol=1e-6)
    np.testing.assert_allclose(out, ops.rms_norm(x + d, w, 1e-6), rtol=1e-6)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_as_complex_rotation(neox):
    t, h, d = 5, 3, 64
    x = rng.normal(size=(t, h, d)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 4095])
    out = ops.rope(x, pos, 10000.0, neox)
    if neox:
        z = x[..., : d // 2] + 1j * x[..., d // 2:]
    else:
        z = x[..., 0::2] + 1j * x[..., 1::2]
    theta = pos[:, None] * 10000.0 ** (-np.arange(d // 2) * 2 / d)
    z = z * np.exp(1j * theta)[:, None, :]
    want = np.empty_like(x)
    if neox:
        want[..., : d // 2], want[..., d // 2:] = z.real, z.imag
    else:
        want[..., 0::2], want[..., 1::2] = z.real, z.imag
    np.testing.assert_allclose(out, want, atol=1e-5)
    assert np.array_equal(out[0], x[0])                     # position 0 is the identity


def test_gated_activations():
    gu = rng.normal(0, 2, (3, 2 * 33)).astype(np.float32)
    g, u = gu[:, :33].astype(np.float64), gu[:, 33:]
    np.testing.assert_allclose(ops.silu_mul(gu), g * (1 / (1 + np.exp(-g))) * u, rtol=1e-5)
    from math import erf
    gelu_exact = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))(g)
    np.testing.assert_allclose(ops.gelu_mul(gu), gelu_exact * u, atol=2e-3)   # tanh form is within 1e-3
    np.testing.assert_allclose(ops.softcap(gu, 5.0), 5 * np.tanh(gu / 5), rtol=1e-6)


def dense_causal(q, k, v, scale, window=0):
    """Plain attention for one contiguous sequence: q (T, Hq, D) at the last T of n positions."""
    t, hq, d = q.shape
    n, hkv = k.shape[:2]
    g = hq // hkv
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    s = np.einsum("thd,nhd->htn", q, k) * scale
    qpos = np.arange(n - t, n)[:, None]
    kpos = np.arange(n)[None, :]
    hidden = (kpos > qpos) | ((qpos - kpos >= window) if window else False)
    s = np.where(hidden[None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("htn,nhd->thd", p, v)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_over_scattered_cells_matches_dense(window):
    hq, hkv, d, cells = 6, 2, 16, 64
    k_pool = rng.normal(size=(cells, hkv, d)).astype(np.float32)
    v_pool = rng.normal(size=(cells, hkv, d)).astype(np.float32)
    lens = [9, 4]
    perm = rng.permutation(np.arange(1, cells))
    tables = [perm[:9], perm[9:13]]
    # sequence 0 runs its last 3 positions, sequence 1 its last one: one packed step of 4 tokens
    tok_seq = np.array([0, 0, 0, 1])
    tok_pos = np.array([6, 7, 8, 3])
    table = np.zeros((2, 9), np.int32)
    table[0], table[1, :4] = tables[0], tables[1]
    q = rng.normal(size=(4, hq, d)).astype(np.float32)
    out = attention(q, k_pool, v_pool, table, np.array(lens), tok_seq, tok_pos, 0.25, window)
    want0 = dense_causal(q[:3], k_pool[tables[0]], v_pool[tables[0]], 0.25, window)
    want1 = dense_causal(q[3:], k_pool[tables[1]], v_pool[tables[1]], 0.25, window)
    np.testing.assert_allclose(out[:3], want0, atol=1e-5)
    np.testing.assert_allclose(out[3:], want1, atol=1e-5)


def test_attention_visible_mask_and_hidden_rows():
    k_pool = rng.normal(size=(8, 1, 4)).astype(np.float32)
    v_pool = rng.normal(size=(8, 1, 4)).astype(np.float32)
    table = np.array([[1, 2, 3, 4]])
    q = rng.normal(size=(2, 2, 4)).astype(np.float32)
    vis = np.array([[True, True, True, True], [False, False, False, False]])
    out = attention(q, k_pool, v_pool, table, np.array([4]), np.array([0, 0]), np.array([1, 1]), 0.5, visible=vis)
    # row 0 sees its whole block (non-causal), row 1 nothing: zeros, not NaN
    want = dense_causal(q[:1], k_pool[[1, 2, 3, 4]], v_pool[[1, 2, 3, 4]], 0.5)   # last row sees all
    np.testing.assert_allclose(out[:1], want, atol=1e-5)
    assert np.all(out[1] == 0)
    m = visibility(table, np.array([4]), np.array([0]), np.array([2]), window=2)
    assert m.tolist() == [[False, True, True, False]]

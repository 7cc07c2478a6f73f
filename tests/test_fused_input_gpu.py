"""Fused inputs on the GPU (ops/fused_input.py, cuda_src/x_prep.cuh): a one-row GEMV that makes
the residual add + RMSNorm or the gated activation itself must give the bits of the separate ops
followed by the GEMV on their int8 codes, leave the old residual as it was and write
residual + delta, agree with the float64 reference, and replay in a PDL graph as it runs eagerly.

Awkward sizes: K from one 32-value group to 4096 (the norm's launch width from 32 to 1024
threads a row), N not a multiple of the block's 4 rows, every dp4a type.
"""

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.ops.matmul import DOT_TYPES, bucket, fuses_input
from glimmer_cupy.weights.quant_tensor import QuantTensor
from glimmer_cupy.weights.random_blocks import random_blocks

gpu = pytest.mark.gpu
DP4A_TYPES = sorted((q for q in DOT_TYPES if bucket(1, q) == "gemv_dp4a"), key=int)
SHAPES = [(5, 32), (577, 576), (193, 1536), (1000, 2048), (3, 4096), (130, 96)]     # (N, K)
K_SHAPES = [(5, 256), (577, 1536), (3, 4096), (130, 768)]                         # super-blocks of 256
CASES = [(q, n, k) for q in DP4A_TYPES for n, k in (K_SHAPES if q.name.endswith("_K") else SHAPES)]


def _weights(q, n, k, rng):
    w = QuantTensor("w", q, (n, k), random_blocks(q, n, k, rng, 0.05))
    return w, w.to_device()


def _norm_case(rng, k):
    import cupy
    res = cupy.asarray(rng.normal(0, 2, (1, k)).astype(np.float32))
    delta = cupy.asarray(rng.normal(0, 1, (1, k)).astype(np.float32))
    weight = cupy.asarray((1 + 0.2 * rng.standard_normal(k)).astype(np.float32))
    return res, delta, weight


def _separate_norm(res, delta, weight, w_dev, eps):
    """The two ops: add_rms_norm_ on a copy (codes), then the GEMV on them."""
    r = res.copy()
    h = ops.add_rms_norm_(r, delta, weight, eps, q8=True)
    return ops.quant_matmul(h, w_dev), r


@gpu
@pytest.mark.parametrize("q,n,k", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_norm_in_the_gemv_is_the_two_ops_bit_for_bit(q, n, k):
    import cupy
    rng = np.random.default_rng(int(q) * 1000 + k + n)
    w, w_dev = _weights(q, n, k, rng)
    res, delta, weight = _norm_case(rng, k)
    before = cupy.asnumpy(res)
    want, want_res = _separate_norm(res, delta, weight, w_dev, 1e-6)
    assert fuses_input(1, w_dev)
    h = ops.norm_input(res, delta, weight, 1e-6)
    h.residual.fill(np.nan)
    out = cupy.full((1, n), np.nan, cupy.float32)
    ops.quant_matmul(h, w_dev, out=out)
    assert np.array_equal(cupy.asnumpy(out), cupy.asnumpy(want)), (q.name, n, k)
    assert np.array_equal(cupy.asnumpy(h.residual), cupy.asnumpy(want_res))
    assert np.array_equal(cupy.asnumpy(res), before)                # the old residual untouched
    # and against float64: x normed in float64, the GEMV's int8 rounding of x the budget
    r64 = before.astype(np.float64) + cupy.asnumpy(delta)
    x64 = r64 / np.sqrt(np.mean(r64 ** 2) + 1e-6) * cupy.asnumpy(weight)
    ref = x64 @ w.dequantize(np.float64).T
    got = cupy.asnumpy(out)
    assert float(np.mean((got - ref) ** 2) / np.mean(ref ** 2)) < 5e-4


@gpu
@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("q,n,k", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_gated_in_the_gemv_is_the_two_ops_bit_for_bit(q, act, n, k):
    import cupy
    from glimmer_cupy.reference import activation as ref_act
    rng = np.random.default_rng(int(q) * 1000 + k + n + len(act))
    w, w_dev = _weights(q, n, k, rng)
    gu = cupy.asarray(rng.normal(0, 2, (1, 2 * k)).astype(np.float32))
    sep = ops.silu_mul if act == "silu" else ops.gelu_mul
    want = ops.quant_matmul(sep(gu, q8=True), w_dev)
    out = cupy.full((1, n), np.nan, cupy.float32)
    ops.quant_matmul(ops.gated_input(gu, act), w_dev, out=out)
    assert np.array_equal(cupy.asnumpy(out), cupy.asnumpy(want)), (q.name, act, n, k)
    # float64: act(gate) * up is heavy-tailed (a product of two Gaussians), so the int8 step of a
    # group, max|x| / 127, is large against its typical value: NMSE up to ~6e-4 seen, budget 2e-3
    x64 = getattr(ref_act, f"{act}_mul")(cupy.asnumpy(gu).astype(np.float64))
    ref = x64 @ w.dequantize(np.float64).T
    got = cupy.asnumpy(out)
    assert float(np.mean((got - ref) ** 2) / np.mean(ref ** 2)) < 2e-3


@gpu
def test_more_rows_and_several_parts_make_the_input_first():
    """M = 2 and quant_matmul_rows take the separate ops: the same results as calling them."""
    import cupy
    from glimmer_cupy.weights.quant_tensor import QType
    rng = np.random.default_rng(5)
    k = 576
    (_, a), (_, b) = _weights(QType.Q4_1, 64, k, rng), _weights(QType.Q8_0, 32, k, rng)
    res = cupy.asarray(rng.normal(0, 1, (2, k)).astype(np.float32))
    delta = cupy.asarray(rng.normal(0, 1, (2, k)).astype(np.float32))
    weight = cupy.asarray(np.ones(k, np.float32))
    want, want_res = _separate_norm(res, delta, weight, a, 1e-5)
    h = ops.norm_input(res, delta, weight, 1e-5)
    assert np.array_equal(cupy.asnumpy(ops.quant_matmul(h, a)), cupy.asnumpy(want))
    assert np.array_equal(cupy.asnumpy(h.residual), cupy.asnumpy(want_res))
    h1 = ops.norm_input(res[:1].copy(), delta[:1].copy(), weight, 1e-5)
    joined = ops.quant_matmul_rows(h1, [a, b])
    r = res[:1].copy()
    codes = ops.add_rms_norm_(r, delta[:1].copy(), weight, 1e-5, q8=True)
    assert np.array_equal(cupy.asnumpy(joined), np.concatenate(
        [cupy.asnumpy(ops.quant_matmul(codes, a)), cupy.asnumpy(ops.quant_matmul(codes, b))], axis=1))


@gpu
def test_fused_gemvs_replay_in_a_pdl_graph_as_eager():
    """norm GEMV -> gated GEMV -> norm GEMV chained as a decode step chains them, captured with
    programmatic dependent launch: the graph's outputs equal the eager run's."""
    import cupy
    from glimmer_cupy.kernels.launch import overlapped
    from glimmer_cupy.weights.quant_tensor import QType
    rng = np.random.default_rng(11)
    hidden, ffn = 576, 1536
    (_, gate_up), (_, down), (_, qkv) = (_weights(QType.Q4_1, n, k, rng) for n, k in
                                         ((2 * ffn, hidden), (hidden, ffn), (960, hidden)))
    res0, delta, weight = _norm_case(rng, hidden)

    def step():
        h = ops.norm_input(res0, delta, weight, 1e-5)
        gu = ops.quant_matmul(h, gate_up)
        d = ops.quant_matmul(ops.gated_input(gu, "silu"), down)
        h2 = ops.norm_input(h.residual, d, weight, 1e-5)
        return ops.quant_matmul(h2, qkv), h2.residual

    want, want_res = (cupy.asnumpy(a) for a in step())
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream, overlapped():
        step()
        stream.synchronize()
        stream.begin_capture()
        y, r = step()
        graph = stream.end_capture()
        y.fill(np.nan)
        r.fill(np.nan)
        graph.launch(stream)
        stream.synchronize()
    assert np.array_equal(cupy.asnumpy(y), want)
    assert np.array_equal(cupy.asnumpy(r), want_res)

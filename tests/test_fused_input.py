"""Fused inputs on the NumPy path and their argument checks (ops/fused_input.py).

On NumPy arrays a fused input is made by the reference ops, so quant_matmul of one must equal the
separate ops followed by quant_matmul; the new residual is residual + delta and the old one is left
as it was. The GPU kernels are held to the same ops bit for bit in test_fused_input_gpu.py.
"""

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.ops.matmul import fuses_input
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
from glimmer_cupy.weights.random_blocks import random_blocks


def _w(rng, n=40, k=96, q=QType.Q4_1):
    return QuantTensor("w", q, (n, k), random_blocks(q, n, k, rng, 0.05))


def test_norm_input_is_add_rms_norm_then_the_matmul():
    rng = np.random.default_rng(0)
    w = _w(rng)
    res = rng.normal(0, 1, (3, 96)).astype(np.float32)
    delta = rng.normal(0, 1, (3, 96)).astype(np.float32)
    weight = (1 + 0.1 * rng.standard_normal(96)).astype(np.float32)
    before = res.copy()
    r = res.copy()
    want = ops.quant_matmul(ops.add_rms_norm_(r, delta, weight, 1e-5), w)
    h = ops.norm_input(res, delta, weight, 1e-5)
    got = ops.quant_matmul(h, w)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(h.residual, r)
    np.testing.assert_array_equal(res, before)
    # a second consumer sees the same input, made once
    np.testing.assert_array_equal(ops.quant_matmul_rows(h, [w, w]), np.concatenate([want, want], axis=1))


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_gated_input_is_the_gated_op_then_the_matmul(act):
    rng = np.random.default_rng(1)
    w = _w(rng)
    gu = rng.normal(0, 1, (2, 192)).astype(np.float32)
    sep = ops.silu_mul if act == "silu" else ops.gelu_mul
    np.testing.assert_array_equal(ops.quant_matmul(ops.gated_input(gu, act), w), ops.quant_matmul(sep(gu), w))


def test_host_weights_never_fuse():
    assert not fuses_input(1, _w(np.random.default_rng(2)))


def test_bad_input_names_the_argument():
    rng = np.random.default_rng(3)
    res = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match="norm_input: delta"):
        ops.norm_input(res, np.zeros((1, 32), np.float32), np.ones(64, np.float32), 1e-5)
    with pytest.raises(ValueError, match="norm_input: weight"):
        ops.norm_input(res, res.copy(), np.ones(63, np.float32), 1e-5)
    with pytest.raises(ValueError, match="norm_input: eps"):
        ops.norm_input(res, res.copy(), np.ones(64, np.float32), 0.0)
    with pytest.raises(ValueError, match="norm_input: residual"):
        ops.norm_input(res.astype(np.float64), res.copy(), np.ones(64, np.float32), 1e-5)
    with pytest.raises(ValueError, match="gated_input: act"):
        ops.gated_input(np.zeros((1, 64), np.float32), "relu")
    with pytest.raises(ValueError, match="gated_input: gate_up"):
        ops.gated_input(np.zeros((1, 63), np.float32))
    w = _w(rng, k=96)
    with pytest.raises(ValueError, match="quant_matmul: x must be K = 96 wide"):
        ops.quant_matmul(ops.norm_input(res, res.copy(), np.ones(64, np.float32), 1e-5), w)

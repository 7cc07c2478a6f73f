"""A matmul's input described instead of made: the residual add + RMSNorm and the gated activation,
made by the one-row GEMV that reads them (kernels: cuda_src/x_prep.cuh, quant_matmul.cu).

In a one-token decode step every norm and activation is a launch of its own between two GEMVs,
and each costs a kernel boundary (~1-2 us on the H200) for a few KB of work. `norm_input` and
`gated_input` return what to compute; `quant_matmul` given one at M = 1 on the int8 GEMV
(gemv_dp4a) launches gemv_dp4a_norm_kernel / gemv_dp4a_gated_kernel, whose blocks each make the
row's int8 codes in shared memory (the same bits as the separate ops). Anywhere else (more rows,
other buckets, NumPy arrays, several matrix parts) the input is made first by the separate ops
(`materialize`), so a consumer never sees a difference but speed.

The residual add is out of place here: `NormInput.residual` is a new array that holds
residual + delta once a consumer has run (block 0 of the fused GEMV writes it, while the other
blocks still read the old residual).
"""

from __future__ import annotations

import numpy as np

from ._check import F32, aligned, check, fail
from ._dispatch import is_host

GATED_ACTS = {"silu": "Silu", "gelu": "GeluTanh"}
FUSED_SMEM_MAX = 48 << 10           # the fused GEMVs ask for no more than the default dynamic shared memory


def fused_smem(k: int, norm: bool) -> int:
    """Bytes of shared memory a fused GEMV over K values asks for (xprep::smem_bytes in x_prep.cuh)."""
    return k + 8 * (k // 32) + (4 * (k + 32) if norm else 0)


class NormInput:
    """rms_norm(residual + delta) * weight for T rows, made by its consumer; `residual` receives
    residual + delta."""

    __slots__ = ("old", "delta", "weight", "eps", "residual", "_made")

    def __init__(self, residual, delta, weight, eps: float):
        op = "norm_input"
        check(residual, op, "residual", dtypes=(F32,), shape=("T", "d"))
        check(delta, op, "delta", dtypes=(F32,), shape=tuple(residual.shape), like=residual)
        check(weight, op, "weight", dtypes=(F32,), shape=(residual.shape[1],), like=residual)
        if not eps > 0:
            raise fail(op, "eps", "positive", eps)
        self.old, self.delta, self.weight, self.eps = residual, delta, weight, float(eps)
        xp = np if is_host(residual) else _cupy()
        self.residual = xp.empty_like(residual)
        self._made = None

    @property
    def shape(self):
        return self.old.shape

    def fusable(self) -> bool:
        """Whether a fused GEMV can read it: one row, whole 32-value groups, 16-byte aligned rows."""
        d = self.old.shape[1]
        return (not is_host(self.old) and self.old.shape[0] == 1 and d % 32 == 0
                and aligned(self.old, self.delta, self.weight, self.residual))

    def materialize(self):
        """The input made by the separate ops (once): Q8Rows on the GPU, an array on NumPy."""
        if self._made is None:
            from .norm import add_rms_norm_
            self.residual[...] = self.old
            self._made = add_rms_norm_(self.residual, self.delta, self.weight, self.eps, q8=True)
        return self._made


class GatedInput:
    """act(gate) * up for gate_up = [gate | up] (T, 2F), made by its consumer."""

    __slots__ = ("gate_up", "act", "_made")

    def __init__(self, gate_up, act: str):
        op = "gated_input"
        if act not in GATED_ACTS:
            raise fail(op, "act", f"one of {', '.join(GATED_ACTS)}", repr(act))
        check(gate_up, op, "gate_up", dtypes=(F32,), shape=("T", "2F"))
        if gate_up.shape[1] % 2 or gate_up.shape[1] == 0:
            raise fail(op, "gate_up", "(T, 2F) with an even, non-zero last axis", tuple(gate_up.shape))
        self.gate_up, self.act, self._made = gate_up, act, None

    @property
    def shape(self):
        return (self.gate_up.shape[0], self.gate_up.shape[1] // 2)

    def fusable(self) -> bool:
        f = self.gate_up.shape[1] // 2
        return not is_host(self.gate_up) and self.gate_up.shape[0] == 1 and f % 32 == 0 and aligned(self.gate_up)

    def materialize(self):
        if self._made is None:
            from .activation import gelu_mul, silu_mul
            self._made = (silu_mul if self.act == "silu" else gelu_mul)(self.gate_up, q8=True)
        return self._made


FusedInput = (NormInput, GatedInput)


def norm_input(residual, delta, weight, eps: float) -> NormInput:
    """add_rms_norm_'s output as a matmul input made by the matmul (out of place: the new residual
    is the result's `.residual`)."""
    return NormInput(residual, delta, weight, eps)


def gated_input(gate_up, act: str = "silu") -> GatedInput:
    """silu_mul's (act "silu") or gelu_mul's ("gelu") output as a matmul input made by the matmul."""
    return GatedInput(gate_up, act)


def made(x):
    """x itself, or a fused input made by the separate ops (Q8Rows or an array)."""
    return x.materialize() if isinstance(x, FusedInput) else x


def _cupy():
    import cupy
    return cupy

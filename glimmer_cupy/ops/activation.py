"""Gated activations and elementwise ops."""

from ..reference import activation as ref
from ._dispatch import is_host, no_kernel


def silu_mul(gate_up):
    """(T, 2F), gate first -> silu(gate) * up, (T, F)."""
    if is_host(gate_up):
        return ref.silu_mul(gate_up)
    raise no_kernel("silu_mul", gate_up)


def gelu_mul(gate_up):
    """(T, 2F), gate first -> gelu_tanh(gate) * up, (T, F)."""
    if is_host(gate_up):
        return ref.gelu_mul(gate_up)
    raise no_kernel("gelu_mul", gate_up)


def softcap(x, cap: float):
    if is_host(x):
        return ref.softcap(x, cap)
    raise no_kernel("softcap", x)


def scale(x, s: float):
    if is_host(x):
        return ref.scale(x, s)
    raise no_kernel("scale", x)

"""RMSNorm, optionally fused with the residual add."""

from ..reference import norm as ref
from ._dispatch import is_host, no_kernel


def rms_norm(x, weight, eps: float):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    if is_host(x):
        return ref.rms_norm(x, weight, eps)
    raise no_kernel("rms_norm", x)


def add_rms_norm_(residual, delta, weight, eps: float):
    """residual += delta (in place); returns rms_norm(residual) * weight."""
    if is_host(residual):
        return ref.add_rms_norm_(residual, delta, weight, eps)
    raise no_kernel("add_rms_norm_", residual)

"""RMSNorm and its residual-fused form, in float32 with the sum of squares in float64."""

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    x64 = x.astype(np.float64)
    inv = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return (x64 * inv * weight).astype(np.float32)


def add_rms_norm_(residual: np.ndarray, delta: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """residual += delta (in place); returns rms_norm(residual) * weight."""
    residual += delta
    return rms_norm(residual, weight, eps)

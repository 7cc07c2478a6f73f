"""Gated activations and small elementwise ops."""

import numpy as np

SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """gate_up: (T, 2F), gate first -> silu(gate) * up, (T, F)."""
    g, u = np.split(gate_up.astype(np.float64), 2, axis=-1)
    return (g / (1.0 + np.exp(-g)) * u).astype(np.float32)


def gelu_mul(gate_up: np.ndarray) -> np.ndarray:
    """gate_up: (T, 2F) -> gelu_tanh(gate) * up (the tanh approximation Gemma is trained with)."""
    g, u = np.split(gate_up.astype(np.float64), 2, axis=-1)
    gelu = 0.5 * g * (1.0 + np.tanh(SQRT_2_OVER_PI * (g + 0.044715 * g ** 3)))
    return (gelu * u).astype(np.float32)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap)."""
    return (cap * np.tanh(x.astype(np.float64) / cap)).astype(np.float32)


def scale(x: np.ndarray, s: float) -> np.ndarray:
    return (x.astype(np.float64) * s).astype(np.float32)

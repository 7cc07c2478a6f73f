"""Rotary position embedding, per token positions.

Two orderings, as GGUF files need them: "normal" rotates adjacent pairs (2i, 2i+1) — llama
files, whose converter permuted q/k to that layout; "neox" rotates (i, i + d/2) — Qwen, Gemma.
Angles: pos * base^(-2i/rot_dim), computed in float64.
"""

import numpy as np


def rope_angles(positions: np.ndarray, rot_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = base ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)   # (rot_dim/2,)
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]               # (T, rot_dim/2)
    return np.cos(ang), np.sin(ang)


def rope(x: np.ndarray, positions: np.ndarray, base: float, neox: bool, rot_dim: int | None = None) -> np.ndarray:
    """x: (T, heads, head_dim) -> rotated copy; only the first rot_dim features rotate."""
    t, h, d = x.shape
    rot_dim = d if rot_dim is None else rot_dim
    cos, sin = rope_angles(positions, rot_dim, base)
    cos, sin = cos[:, None, :], sin[:, None, :]                                   # (T, 1, rot_dim/2)
    out = x.astype(np.float64)
    r = out[..., :rot_dim]
    if neox:
        a, b = r[..., : rot_dim // 2].copy(), r[..., rot_dim // 2:].copy()
        r[..., : rot_dim // 2] = a * cos - b * sin
        r[..., rot_dim // 2:] = a * sin + b * cos
    else:
        a, b = r[..., 0::2].copy(), r[..., 1::2].copy()
        r[..., 0::2] = a * cos - b * sin
        r[..., 1::2] = a * sin + b * cos
    return out.astype(np.float32)

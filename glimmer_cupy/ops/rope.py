"""Rotary position embedding (normal and NeoX ordering), positions per token."""

from ..reference import rope as ref
from ._dispatch import is_host, no_kernel


def rope(x, positions, base: float, neox: bool, rot_dim: int | None = None):
    """x: (T, heads, head_dim) -> rotated (T, heads, head_dim)."""
    if is_host(x):
        return ref.rope(x, positions, base, neox, rot_dim)
    raise no_kernel("rope", x)

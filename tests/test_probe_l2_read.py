"""bench/probe_l2_read.py's buffer sizes (CPU): the kernel wraps its piece index with a mask, so
only powers of two are accepted, and the bad size is named."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from probe_l2_read import pieces  # noqa: E402


def test_pieces_of_a_power_of_two():
    assert pieces(4) == 4 * (1 << 20) // 16
    assert pieces(1024) == 1 << 26


@pytest.mark.parametrize("mib", [0, 3, 48, -8])
def test_other_sizes_are_refused_by_name(mib):
    with pytest.raises(SystemExit, match=f"--mib {mib}: a power of two"):
        pieces(mib)

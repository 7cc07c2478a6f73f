"""bench/probe_attention_wgmma.py's summary of attn_wgmma_kernel's phase stamps (CPU: stamps made
up with known sums)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from probe_attention_wgmma import FIRST_PHASE, LOOP_CYCLES, OUTPUT, PHASES, Q_READ, summary  # noqa: E402


def test_summary_divides_each_phase_by_the_tiles_and_the_loop():
    s = np.zeros((2, 16), np.int64)
    s[:, 0] = [1_000, 1_500]                   # start (ns)
    s[:, 2] = [2_000, 2_500]                   # tile loop begun
    s[:, 3] = [4_000, 6_500]                   # ended: 2,000 + 4,000 ns
    s[:, 4] = [5_000, 7_000]                   # done
    s[:, 5] = [3, 7]                           # tiles
    s[:, FIRST_PHASE:FIRST_PHASE + len(PHASES)] = np.arange(1, len(PHASES) + 1) * 100   # 100 .. 700 a block
    s[:, Q_READ] = [300, 500]                  # the items' q reads
    s[:, OUTPUT] = [100, 100]                  # and outputs
    s[:, LOOP_CYCLES] = [5_000, 7_000]         # 12,000 cycles over 6,000 ns
    r = summary(s)
    assert r["launch_us"] == pytest.approx(6.0) and r["tiles"] == 10 and r["ghz"] == pytest.approx(2.0)
    assert r["phases"]["copies issued"] == pytest.approx((20.0, 200 / 12_000))
    assert r["phases"]["closing barrier"] == pytest.approx((140.0, 1_400 / 12_000))
    assert r["phases"]["(items' q read)"] == pytest.approx((80.0, 800 / 12_000))
    assert r["phases"]["(items' output)"] == pytest.approx((20.0, 200 / 12_000))
    rest = 12_000 - 2 * sum(range(100, 800, 100)) - 800 - 200
    assert r["phases"]["(the rest)"] == pytest.approx((rest / 10, rest / 12_000))
    assert sum(share for _, share in r["phases"].values()) == pytest.approx(1.0)

"""bench/sass_by_source.py --stamps: the instructions between a kernel's stamps, read from nvdisasm's
listing (CPU; a listing in nvdisasm 13's format, so no compiler is needed)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from sass_by_source import stamp_regions  # noqa: E402

LISTING = """\
.text._Z5otherv:
        /*0000*/                   CS2R R2, SR_GLOBALTIMERLO ;
        /*0010*/                   STG.E.64 desc[UR4][R8.64+0x8], R2 ;
//--------------------- .text._Z1kPy --------------------------
.text._Z1kPy:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/               @P1 CS2R R14, SR_GLOBALTIMERLO ;
        /*0020*/                   IMAD R3, R3, 0x2, RZ ;
        /*0030*/               @P1 STG.E.64 desc[UR12][R154.64], R14 ;
        /*0040*/                   IADD3 R4, R4, 0x1, RZ ;
        /*0050*/                   IADD3 R4, R4, 0x1, RZ ;
        /*0060*/                   CS2R R30, SR_GLOBALTIMERLO ;
        /*0070*/                   STG.E.64 desc[UR12][R154.64+0x8], R14 ;
        /*0080*/                   STG.E.64 desc[UR12][R154.64+0x28], R30 ;
        /*0090*/                   CS2R R40, SR_GLOBALTIMERLO ;
        /*00a0*/                   EXIT ;
//--------------------- .text._Z5otherv --------------------------
"""


def test_each_stamp_with_the_instructions_before_it():
    regions = stamp_regions(LISTING, "_Z1kPy")
    # stamp 0 (no offset) after 1 instruction; the second timer is stored at +0x28 (index 5), not by
    # the store of the first timer's register at +0x8; the third is never stored (index unknown)
    assert regions == [(0, 0x10, 1), (5, 0x60, 5), (None, 0x90, 3), (None, 0xb0, 2)]


def test_an_unknown_kernel_is_named():
    with pytest.raises(SystemExit, match="nope"):
        stamp_regions(LISTING, "nope")

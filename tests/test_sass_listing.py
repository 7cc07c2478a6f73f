"""bench/sass_by_source.py's readings of nvdisasm's listing: the instructions between a kernel's stamps
(--stamps), the registers an instruction writes, operands a loop lets die on its back edge, and
operands written while a multiply may still read them (CPU;
listings in nvdisasm 13's format, so no compiler is needed)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from sass_by_source import inflight_clobbers, loop_clobbers, stamp_regions, written  # noqa: E402

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


# A warpgroup multiply reading its A fragments from R100..R103 inside a loop, as attn_wgmma_kernel's
# scores did at head dim 64: defined once before the loop, then R101 written over inside it by the
# packing of P, so the loop's second pass multiplies by P's values.
CLOBBERED = """\
.text._Z1kv:
        /*0000*/                   F2FP.BF16.F32.PACK_AB R100, R15, R14 ;
.L_x_1:
        /*0010*/                   WARPGROUP.ARRIVE ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, R100, gdesc[UR20], RZ, !UPT, gsb0 ;
        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0040*/                   F2FP.BF16.F32.PACK_AB R101, R25, R24 ;
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R56, R100, gdesc[UR20].tnspB, R56, gsb0 ;
        /*0060*/               @P0 BRA `(.L_x_1) ;
        /*0070*/                   EXIT ;
"""
SCORES = r"HGMMA\.\S+ R\d+, R(\d+), gdesc\[\w+\],"


def test_a_fragment_written_over_inside_its_loop_is_found():
    [clobber] = loop_clobbers(CLOBBERED, "_Z1kv", SCORES, 4)
    assert clobber.startswith("R101 (read by HGMMA.64x64x16.F32.BF16 R24, R100")
    assert clobber.endswith("written by F2FP.BF16.F32.PACK_AB R101, R25, R24)")


def test_a_fragment_loaded_again_at_the_loop_head_is_not_a_clobber():
    reloaded = CLOBBERED.replace("WARPGROUP.ARRIVE ;", "LDS.128 R100, [R0+0x8000] ;", 1)
    assert loop_clobbers(reloaded, "_Z1kv", SCORES, 4) == []
    # nor one the loop never writes
    assert loop_clobbers(CLOBBERED.replace("PACK_AB R101", "PACK_AB R120"), "_Z1kv", SCORES, 4) == []


# The loop of CLOBBERED without the clobber, an outer loop whose end loads the next pass's inputs
# into R100.. once the inner loop is left (then packed again before it), and a barrier wait whose
# retry ptxas put out of line after the function's end, branching back into the inner loop.
OUT_OF_LINE = """\
.text._Z1kv:
.L_x_0:
        /*0000*/                   F2FP.BF16.F32.PACK_AB R100, R15, R14 ;
.L_x_1:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R3+URZ], R4 ;
        /*0020*/              @!P1 BRA `(.L_x_8) ;
.L_x_2:
        /*0030*/                   WARPGROUP.ARRIVE ;
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R24, R100, gdesc[UR20], RZ, !UPT, gsb0 ;
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0060*/                   F2FP.BF16.F32.PACK_AB R120, R25, R24 ;
        /*0070*/                   HGMMA.64x64x16.F32.BF16 R56, R120, gdesc[UR20].tnspB, R56, gsb0 ;
        /*0080*/               @P0 BRA `(.L_x_1) ;
        /*0090*/                   LDG.E.64 R100, desc[UR26][R6.64] ;
        /*00a0*/               @P2 BRA `(.L_x_0) ;
        /*00b0*/                   EXIT ;
.L_x_8:
        /*00c0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R3+URZ], R4 ;
        /*00d0*/              @!P1 BRA `(.L_x_8) ;
        /*00e0*/                   BRA `(.L_x_2) ;
"""


def test_a_write_after_the_loop_is_left_is_not_a_clobber():
    """The innermost loop is the one the readers' first back edge closes: the out-of-line retry's
    edge into it does not make the outer loop's end part of it."""
    assert loop_clobbers(OUT_OF_LINE, "_Z1kv", SCORES, 4) == []
    # the same write inside the inner loop is
    inside = OUT_OF_LINE.replace("PACK_AB R120, R25, R24", "PACK_AB R101, R25, R24")
    assert [c.split(" ")[0] for c in loop_clobbers(inside, "_Z1kv", SCORES, 4)] == ["R101"]


def test_readers_outside_any_loop_are_an_error():
    with pytest.raises(ValueError, match="no loop"):
        loop_clobbers(CLOBBERED.replace("`(.L_x_1) ;", "`(.L_x_9) ;\n.L_x_9:"), "_Z1kv", SCORES, 4)


@pytest.mark.parametrize("text,regs", [
    ("SHFL.BFLY PT, R89, R88, 0x1, 0x1f ;", {89}),
    ("ISETP.GE.AND P2, PT, R100, R20, PT ;", set()),
    ("@!P1 FFMA R89, R88, R27, R88 ;", {89}),
    ("LDS.128 R88, [R0+0x8000] ;", {88, 89, 90, 91}),
    ("IMAD.WIDE R2, R3, 0x4, R4 ;", {2, 3}),
    ("HGMMA.64x64x16.F32.BF16 R24, R100, gdesc[UR20], RZ, !UPT ;", set(range(24, 56))),
    ("STS.64 [R12+0x160], R100 ;", set()),
    ("FMUL R88, R25.reuse, UR18 ;", {88}),
    ("R2UR UR4, R2 ;", set()),
])
def test_the_registers_an_instruction_writes(text, regs):
    assert written(text) == regs


# O += P V with P from R152..R155 and the softmax of the next tile run beside it, as FA3 orders them:
# ptxas gave one of the softmax's temporaries R153 before the wait for the multiply.
IN_FLIGHT = """\
.text._Z1kv:
        /*0000*/                   WARPGROUP.ARRIVE ;
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R56, R152, gdesc[UR16].tnspB, R56, gsb0 ;
        /*0020*/                   FMUL.FTZ R40, R30, R31 ;
        /*0030*/                   IMAD R153, R5, 0x40, R20 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   FADD R57, R57, R40 ;
        /*0060*/                   EXIT ;
"""


def test_a_register_written_while_its_multiply_runs_is_found():
    [clobber] = inflight_clobbers(IN_FLIGHT, "_Z1kv")
    assert clobber.startswith("R153 (in HGMMA.64x64x16.F32.BF16 R56, R152")
    assert clobber.endswith("written by IMAD R153, R5, 0x40, R20)")
    # an accumulator is the multiply's too
    acc = IN_FLIGHT.replace("IMAD R153", "IMAD R70")
    assert [c.split(" ")[0] for c in inflight_clobbers(acc, "_Z1kv")] == ["R70"]


def test_registers_written_after_the_wait_or_by_other_multiplies_are_not_clobbers():
    after = IN_FLIGHT.replace("IMAD R153, R5, 0x40, R20 ;", "NOP ;").replace("FADD R57", "FADD R153")
    assert inflight_clobbers(after, "_Z1kv") == []
    chained = IN_FLIGHT.replace("IMAD R153, R5, 0x40, R20 ;",
                                "HGMMA.64x64x16.F32.BF16 R56, R156, gdesc[UR16].tnspB, R56, gsb0 ;")
    assert inflight_clobbers(chained, "_Z1kv") == []


def test_a_partial_wait_ends_the_groups_before_the_newest():
    """DEPBAR.LE gsb0, 0x1 leaves one group pending: a multiply's registers are free after it once a
    later group was committed, and not before."""
    two_groups = IN_FLIGHT.replace("IMAD R153, R5, 0x40, R20 ;",
                                   "HGMMA.64x64x16.F32.BF16 R88, R160, gdesc[UR16].tnspB, R88, gsb0 ;\n"
                                   "        /*0031*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n"
                                   "        /*0032*/                   IMAD R153, R5, 0x40, R20 ;")
    assert inflight_clobbers(two_groups, "_Z1kv") == []
    one_group = IN_FLIGHT.replace("IMAD R153, R5, 0x40, R20 ;",
                                  "WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n"
                                  "        /*0031*/                   IMAD R153, R5, 0x40, R20 ;")
    assert [c.split(" ")[0] for c in inflight_clobbers(one_group, "_Z1kv")] == ["R153"]

"""bench/ab_prefill.py: its arms' syntax (CPU), and on the GPU that each arm's defines reach the
kernel that runs (the build layer and ops.attention cache kernels by their own arguments only)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import ab_prefill  # noqa: E402


def test_an_arm_names_its_defines_module_values_and_keyword_arguments():
    assert ab_prefill.parse_arm("main") == ("main", [], {}, {})
    name, defines, attrs, kwargs = ab_prefill.parse_arm(
        "r128:ATTN_WGMMA_COPY_ONLY, X:WGMMA_PERSISTENT=False:force_rows=128,force_producer=False")
    assert name == "r128" and defines == ["ATTN_WGMMA_COPY_ONLY", "X"]
    assert attrs == {"WGMMA_PERSISTENT": False} and kwargs == {"force_rows": 128, "force_producer": False}


@pytest.mark.parametrize("arm, words", [("a::NO_SUCH_VALUE=1", "has no 'NO_SUCH_VALUE'"),
                                        ("a:::force_rows", "'force_rows' is not KEY=VALUE")])
def test_a_bad_arm_is_named(arm, words):
    with pytest.raises(SystemExit, match=words):
        ab_prefill.parse_arm(arm)


def test_an_arm_compiles_only_the_variants_it_runs():
    seen = []

    def fake(d, stages, rows, producer=False):
        seen.append(ab_prefill.attention._WGMMA_EXPRS)
        return "kernel"

    every = ab_prefill.attention._WGMMA_EXPRS
    assert ab_prefill.compiled_alone(fake)(128, 3, 128, True) == "kernel"
    assert seen == [("attn_wgmma_kernel<128, 3, 2, true>",)]
    assert ab_prefill.attention._WGMMA_EXPRS == every and len(every) > 1


@pytest.mark.gpu
def test_each_arm_runs_its_own_build(tmp_path):
    pytest.importorskip("torch")
    from glimmer_cupy.ops.attention import wgmma_runs
    if not wgmma_runs(128, 4):
        pytest.skip("the warpgroup prefill kernel needs an sm_90 device")
    out = tmp_path / "ab.json"
    assert ab_prefill.main(["--arms", "main;copy:ATTN_WGMMA_COPY_ONLY;again", "--lengths", "320", "--rounds", "1",
                            "--launches", "2", "--reps", "1", "--out", str(out)]) == 0
    err = json.loads(out.read_text())["rows"][0]["nmse_vs_sdpa"]
    assert err["main"] < 1e-4 and err["again"] < 1e-4     # after the define's arm, the default build again
    assert err["copy"] > 0.5                              # no multiplies: zeros

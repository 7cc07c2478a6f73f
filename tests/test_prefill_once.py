"""bench/prefill_once.py's arguments (CPU): --set values, and one clear line for what it cannot run."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import prefill_once  # noqa: E402


def test_set_takes_a_literal_for_a_value_of_ops_attention():
    assert prefill_once.parse_set("WGMMA_PERSISTENT=False") == ("WGMMA_PERSISTENT", False)
    assert prefill_once.parse_set(" WGMMA_MAX_BLOCKS = 5 ") == ("WGMMA_MAX_BLOCKS", 5)
    with pytest.raises(ValueError, match="has no 'NOT_A_VALUE'"):
        prefill_once.parse_set("NOT_A_VALUE=1")
    with pytest.raises(ValueError, match="not NAME=VALUE"):
        prefill_once.parse_set("WGMMA_PERSISTENT")
    with pytest.raises(ValueError, match="not a Python literal"):
        prefill_once.parse_set("WGMMA_PERSISTENT=yes please")


@pytest.mark.parametrize("argv,message", [
    (["--heads", "32,8"], "--heads: three integers"),
    (["--set", "NOPE=1"], "has no 'NOPE'"),
    (["0"], "at least 1, got 0"),
])
def test_bad_arguments_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        prefill_once.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]


def test_no_gpu_is_one_line(capsys):
    from glimmer_cupy.kernels import build
    try:
        build.sm_count()
    except build.NoDeviceError:
        pass
    else:
        pytest.skip("a GPU is here: the script would run")
    with pytest.raises(SystemExit) as e:
        prefill_once.main([])
    assert e.value.code == 2
    assert "no GPU to run on" in capsys.readouterr().err.strip().splitlines()[-1]

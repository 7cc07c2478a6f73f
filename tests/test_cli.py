"""The glimmer command: generation on a tiny model, and one line + exit 2 for every bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest
from gguf_factory import tiny_model, write_gguf

from glimmer_cupy.cli import main
from glimmer_cupy.weights.quant_tensor import QType


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_model(tmp_path_factory.mktemp("cli") / "tiny.gguf", "qwen3"))


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_json_greedy_is_deterministic(tiny, capsys):
    rc, out, err = run(capsys, "run", "-m", tiny, "-p", "hello tok5 tok7", "-n", "6", "--temperature", "0",
                       "--json", "--device", "cpu")
    assert rc == 0, err
    obj = json.loads(out)
    assert set(obj) == {"prompt_tokens", "tokens", "text"}
    assert len(obj["tokens"]) == 6 or obj["tokens"][-1] in (318, 319)
    rc2, out2, _ = run(capsys, "run", "-m", tiny, "-p", "hello tok5 tok7", "-n", "6", "--temperature", "0",
                       "--json", "--device", "cpu")
    assert json.loads(out2) == obj
    assert "device: cpu" in err and "tok/s" in err


def test_run_sampled_seed_reproduces(tiny, capsys):
    args = ["run", "-m", tiny, "-p", "abc", "-n", "8", "--temperature", "1.0", "--top-k", "0", "--top-p",
            "1", "--seed", "42", "--json", "--device", "cpu"]
    a = json.loads(run(capsys, *args)[1])
    b = json.loads(run(capsys, *args)[1])
    c = json.loads(run(capsys, *args[:-4], "43", "--json", "--device", "cpu")[1])
    assert a == b and a["tokens"] != c["tokens"]


def test_info(tiny, capsys):
    rc, out, _ = run(capsys, "info", tiny)
    assert rc == 0 and "qwen3" in out and "Q8_0" in out and "4 query heads, 2 KV heads" in out


def bad(capsys, *argv) -> str:
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_bad_arguments(tiny, capsys):
    assert "-n must be > 0, got 0" in bad(capsys, "run", "-m", tiny, "-p", "x", "-n", "0")
    assert "got -3" in bad(capsys, "run", "-m", tiny, "-p", "x", "-n", "-3")
    assert "temperature" in bad(capsys, "run", "-m", tiny, "-p", "x", "--temperature", "-1")
    assert "top-p must be in (0, 1], got 0.0" in bad(capsys, "run", "-m", tiny, "-p", "x", "--top-p", "0")
    assert "top-p" in bad(capsys, "run", "-m", tiny, "-p", "x", "--top-p", "1.5")
    assert "top-k" in bad(capsys, "run", "-m", tiny, "-p", "x", "--top-k", "-1")
    assert "top-k must be in [0, 320], got 1000" in bad(capsys, "run", "-m", tiny, "-p", "x", "--top-k", "1000")
    with pytest.raises(SystemExit) as e:                   # argparse's own errors: one line too
        main(["run", "-m", tiny, "-n", "abc", "-p", "x"])
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_bad_files(tmp_path, tiny, capsys):
    assert "no such file" in bad(capsys, "run", "-m", str(tmp_path / "missing.gguf"), "-p", "x")
    assert "not a known model name" in bad(capsys, "run", "-m", "no-such-model", "-p", "x")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00" * 100)
    assert "not a GGUF file" in bad(capsys, "run", "-m", str(junk), "-p", "x")
    data = open(tiny, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    assert "truncated" in bad(capsys, "run", "-m", str(cut), "-p", "x")
    x = np.ones((4, 32), np.float32)
    arch = write_gguf(tmp_path / "rwkv.gguf", "rwkv6", {}, {"a": (QType.F32, x, x.shape)})
    assert "architecture 'rwkv6' is not supported" in bad(capsys, "run", "-m", str(arch), "-p", "x")
    assert "not supported" in bad(capsys, "info", str(arch))


def test_prompt_longer_than_context(tiny, capsys):
    long = " ".join(f"tok{i % 50}" for i in range(300))            # the tiny model's context is 256
    msg = bad(capsys, "run", "-m", tiny, "-p", long, "-n", "4", "--device", "cpu")
    assert "exceeds the context of 256 tokens" in msg


def test_console_script_entry_point(tiny):
    done = subprocess.run([sys.executable, "-m", "glimmer_cupy.cli", "run", "-m", tiny, "-p", "x", "-n", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1

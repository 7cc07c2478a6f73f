"""The model A/B harness (glimmer_cupy/benchmarks/model_ab.py) on the CPU: arms set and put back,
alternated in rounds, bad arms refused; the decode benchmark itself is replaced by a recorder."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from glimmer_cupy.benchmarks import model_ab


class KNOB:                              # stands for a module: attributes an arm replaces
    depth = 3
    rule = len


def test_applied_sets_and_restores_even_on_error():
    with model_ab.applied({(KNOB, "depth"): 2, (KNOB, "rule"): max}):
        assert KNOB.depth == 2 and KNOB.rule is max
    assert KNOB.depth == 3 and KNOB.rule is len
    with pytest.raises(RuntimeError), model_ab.applied({(KNOB, "depth"): 5}):
        assert KNOB.depth == 5
        raise RuntimeError("inside the arm")
    assert KNOB.depth == 3


def test_run_arms_alternates_and_times_each_arm_as_set(monkeypatch):
    seen = []

    def fake_bench(model, label, **kw):
        seen.append((label, KNOB.depth, kw["batch"]))
        return types.SimpleNamespace(gpu_step_us=100.0 + KNOB.depth)

    monkeypatch.setattr(model_ab, "bench_decode", fake_bench)
    monkeypatch.setattr(model_ab, "run_meta", lambda: {})
    monkeypatch.setattr("glimmer_cupy.model.model.load_model",
                        lambda path: types.SimpleNamespace(cfg=types.SimpleNamespace(n_layers=4)))
    lines = []
    got = model_ab.run_arms([("m", Path("m.gguf"))], {"rule": {}, "deep": {(KNOB, "depth"): 7}}, rounds=2,
                            say=lines.append, batch=16)
    assert seen == [("m", 3, 16), ("m", 7, 16)] * 2 and KNOB.depth == 3
    runs = got["models"]["m"]["runs"]
    assert [r["arm"] for r in runs] == ["rule", "deep"] * 2
    assert [r["gpu_step_us"] for r in runs] == [103.0, 107.0] * 2 and len(lines) == 4


@pytest.mark.parametrize("argv,what", [(["--synthetic", "qwen3-8b", "--arms", "rule,nope"], "nope"),
                                       ([], "name a model")])
def test_main_refuses_unknown_arms_and_no_model(argv, what, capsys):
    with pytest.raises(SystemExit) as e:
        model_ab.main("doc\n\nmore", {"rule": {}}, argv)
    assert e.value.code == 2 and what in capsys.readouterr().err

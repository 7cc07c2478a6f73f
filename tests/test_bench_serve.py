"""`glimmer bench serve` (glimmer_cupy/benchmarks/serve.py) on the NumPy path with a tiny model: the
arrivals, the per-request TTFT and TPOT against a clock the test drives, the prefix cache's share,
and the command's files and bad arguments."""

import json

import numpy as np
import pytest
from gguf_factory import tiny_model

from glimmer_cupy.benchmarks.serve import arrivals, bench_serve, markdown
from glimmer_cupy.cli import main
from glimmer_cupy.model.model import load_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve") / "tiny.gguf", "llama")


class Clock:
    """Time that passes only as the test says: `step` seconds a reading, and whatever sleep asks."""

    def __init__(self, step: float):
        self.t, self.step, self.slept = 0.0, step, 0.0

    def __call__(self) -> float:
        self.t += self.step
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.slept += s


def test_arrivals():
    assert arrivals(4, 0.0) == [0.0] * 4
    a = arrivals(4000, 50.0, seed=1)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    assert np.mean(np.diff(a)) == pytest.approx(1 / 50, rel=0.05)


def test_all_at_once(tiny):
    model = load_model(tiny)
    clock = Clock(0.001)
    r = bench_serve(model, "tiny", None, 400, requests=6, rate=0.0, prompt_tokens=40, shared_tokens=32, gen_tokens=5,
                    clock=clock, sleep=clock.sleep)
    assert r.generated == 30 and len(r.ttft_s) == len(r.tpot_s) == 6 and clock.slept == 0.0
    assert all(t > 0 for t in r.ttft_s + r.tpot_s) and r.steps >= 5
    assert r.cache_hits == 0                  # admitted together: nothing computed yet to share
    s = r.summary()
    assert s["tok_s"] == pytest.approx(30 / r.seconds) and s["ttft_median_ms"] > 0
    assert "| tiny | 6 | 0 | 40 (32) | 5 | on |" in markdown([r], dict(gpu="cpu", date="d", commit="c"))


def test_arrivals_apart_share_the_prefix_and_wait_between(tiny):
    model = load_model(tiny)
    hits = {}
    for cache in (True, False):
        clock = Clock(0.001)
        r = bench_serve(model, "tiny", None, 400, requests=5, rate=2.0, prompt_tokens=40, shared_tokens=32,
                        gen_tokens=4, prefix_cache=cache, clock=clock, sleep=clock.sleep)
        assert clock.slept > 0                # idle between arrivals ~0.5 s apart
        assert max(r.ttft_s) < 0.1            # each served as it arrives, timed from its arrival
        hits[cache] = r.cache_hits
    assert hits == {True: 4 * 32, False: 0}   # every later request takes the two shared blocks


def test_the_command_writes_its_table(tiny, tmp_path, capsys):
    out = tmp_path / "serve"
    assert main(["bench", "serve", "-m", str(tiny), "--requests", "3", "--prompt", "20", "--gen", "3",
                 "--device", "cpu", "--compare-cache", "--out", str(out)]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["prefix_cache"] for r in rows] == [True, False] and all(r["generated"] == 9 for r in rows)
    assert "no GPU (the NumPy path)" in out.with_suffix(".md").read_text()
    for argv, msg in ((["--requests", "0"], "--requests must be >= 1, got 0"),
                      (["--rate", "-2"], "--rate must be >= 0"),
                      (["--shared", "300"], "--shared must be in [0, 256] (the prompt), got 300")):
        assert main(["bench", "serve", "-m", str(tiny), "--device", "cpu", *argv]) == 2
        assert msg in capsys.readouterr().err

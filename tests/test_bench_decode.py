"""glimmer bench decode: byte counts and the report on the CPU; the benchmark itself on the GPU."""

import json

import pytest
from gguf_factory import tiny_model
from test_cuda_executor import tiny_cuda_model

from glimmer_cupy.benchmarks.decode import DecodeBench, _one_run, decode_weight_bytes, kv_bytes, markdown
from glimmer_cupy.cli import main
from glimmer_cupy.model.model import load_model
from glimmer_cupy.runtime.host_executor import HostExecutor


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return load_model(tiny_cuda_model(tmp_path_factory.mktemp("b") / "gemma3.gguf", "gemma3"))


def test_weight_bytes_count_the_tied_table_once_as_the_head(gemma, tmp_path):
    w = gemma.weights
    assert gemma.cfg.tied_output
    layers = sum(l.qkv.nbytes + l.wo.nbytes + l.gate_up.nbytes + l.down.nbytes for l in w.layers)
    assert decode_weight_bytes(gemma) == layers + w.embed.nbytes + 4 * sum(
        int(v.size) for v in [w.out_norm] + [x for l in w.layers for x in (l.attn_norm, l.q_norm, l.k_norm,
                                                                          l.post_attn_norm, l.ffn_norm, l.post_ffn_norm)
                                             if x is not None])
    untied = load_model(tiny_model(tmp_path / "llama.gguf", "llama"))
    assert not untied.cfg.tied_output
    assert decode_weight_bytes(untied) < untied.weights.nbytes - untied.weights.embed.nbytes + 10_000


def test_kv_bytes_respect_sliding_windows(gemma):
    cfg = gemma.cfg
    per_pos = 2 * cfg.n_kv_heads * cfg.head_dim * 2
    win = [cfg.window(i) for i in range(cfg.n_layers)]
    assert any(win)
    assert kv_bytes(gemma, 100) == sum(per_pos * (min(100, w) if w else 100) for w in win)


def test_report_fields():
    r = DecodeBench(model="m", prompt_tokens=512, gen_tokens=128, runs=2, graphs=True, pdl=True, weight_bytes_per_token=1_000_000,
                    kv_bytes_per_token=0, copy_bandwidth=4e12, prefill_s=[0.1, 0.3], decode_s=[1.0, 2.0])
    assert r.prefill_tok_s == pytest.approx(512 / 0.2) and r.decode_tok_s == pytest.approx(128 / 1.5)
    assert r.fraction_of_copy == pytest.approx(1e6 * 128 / 1.5 / 4e12)
    text = markdown([r], dict(gpu="G", date="D", commit="C"))
    assert "| m | 1 | 2,560 | 85.3 |" in text
    json.dumps(r.summary())
    # a batch: every sequence's tokens count; a step reads the weights once and each sequence's K/V
    b = DecodeBench(model="m", prompt_tokens=512, gen_tokens=128, runs=1, graphs=True, pdl=True,
                    weight_bytes_per_token=1_000_000, kv_bytes_per_token=1_000, copy_bandwidth=4e12,
                    prefill_s=[0.4], decode_s=[2.0], batch=8)
    assert b.decode_tok_s == pytest.approx(8 * 128 / 2.0) and b.prefill_tok_s == pytest.approx(8 * 512 / 0.4)
    assert b.achieved_bandwidth == pytest.approx((1_000_000 + 8 * 1_000) * 128 / 2.0)
    assert "| m | 8 | 10,240 | 512.0 |" in markdown([b], dict(gpu="G", date="D", commit="C"))


def test_a_batch_decodes_each_sequence_as_alone(tmp_path):
    """The batched run's steps (one token of every sequence) give each sequence the greedy tokens
    it gets alone (NumPy executor)."""
    model = load_model(tiny_model(tmp_path / "llama.gguf", "llama"))
    prompt = list(range(3, 14))
    ex = HostExecutor(model.decoder, 3 * 40)
    *_, alone = _one_run(ex, prompt, 6)
    *_, steps, seqs = _one_run(ex, prompt, 6, chunk=4, batch=3)
    assert len(steps) == 5 and len(seqs) == 3
    for s in seqs:
        assert s.tokens == alone[0].tokens
    *_, sync = _one_run(ex, prompt, 6, chunk=4, batch=3, overlap=False)   # steps launched one at a time
    assert [s.tokens for s in sync] == [s.tokens for s in seqs]


def test_bad_arguments_get_one_line(capsys):
    assert main(["bench", "decode"]) == 2
    assert main(["bench", "decode", "--synthetic", "nope"]) == 2
    assert main(["bench", "decode", "--synthetic", "tiny", "--runs", "0"]) == 2
    assert main(["bench", "decode", "--synthetic", "tiny", "--prefill-chunk", "-1"]) == 2
    assert main(["bench", "decode", "--synthetic", "tiny", "--batch", "1,x"]) == 2
    assert main(["bench", "decode", "--synthetic", "tiny", "--batch", "0"]) == 2
    assert main(["bench", "decode", "--synthetic", "tiny", "--batch", "513"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 7 and all(e.startswith("glimmer: error: bench decode:") for e in err)


@pytest.mark.gpu
def test_bench_decode_runs_on_a_tiny_model(tmp_path, capsys):
    path = tiny_cuda_model(tmp_path / "qwen3.gguf", "qwen3")
    out = tmp_path / "r"
    assert main(["bench", "decode", "-m", str(path), "--prompt", "40", "--gen", "8", "--runs", "2",
                 "--out", str(out), "--profile-step"]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert rows[0]["decode_tok_s"] > 0 and rows[0]["prefill_tok_s"] > 0
    assert 0 < rows[0]["fraction_of_copy"] < 1 and len(rows[0]["decode_s"]) == 2
    # overlapped steps: the host's work hides behind the device's, so a step takes at least
    # about the graph's time (measurement noise aside), and more where the host is slower
    assert rows[0]["overlap"] and 0.9 * rows[0]["gpu_step_us"] < rows[0]["step_us_median"]
    # not overlapped, the device's part of a step: the graph alone takes at most about a step timed
    # from the host (noise aside: on a GPU shared with other processes, as when the GPU tests run
    # in parallel shards, both are mostly waiting for the others and came out 351 against 349 µs)
    assert main(["bench", "decode", "-m", str(path), "--prompt", "40", "--gen", "8", "--runs", "2",
                 "--no-overlap", "--out", str(out)]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert not rows[0]["overlap"] and 0 < rows[0]["gpu_step_us"] < 1.1 * rows[0]["step_us_median"]
    assert "not overlapped" in out.with_suffix(".md").read_text()
    # the prompt in 16-token steps (graphs), as the engine slices it
    assert main(["bench", "decode", "-m", str(path), "--prompt", "40", "--gen", "4", "--runs", "1",
                 "--prefill-chunk", "16", "--out", str(out)]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert rows[0]["prefill_chunk"] == 16 and rows[0]["prefill_tok_s"] > 0
    assert "steps of 16 tokens" in out.with_suffix(".md").read_text()
    # a batch of sequences decoding together (steps of 4 tokens: a captured graph each)
    assert main(["bench", "decode", "-m", str(path), "--prompt", "20", "--gen", "4", "--runs", "1",
                 "--batch", "1,4", "--out", str(out)]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 4] and all(r["decode_tok_s"] > 0 for r in rows)

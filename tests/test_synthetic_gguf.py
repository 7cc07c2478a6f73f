"""glimmer_cupy/weights/synthetic.py (and tools/make_synthetic_gguf.py): random-weight GGUF files
with Qwen3 shapes."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize

from glimmer_cupy.weights import GGUFFile, synthetic

_TOOL = Path(__file__).resolve().parents[1] / "tools" / "make_synthetic_gguf.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("make_synthetic_gguf", _TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up while the class is built
    spec.loader.exec_module(mod)
    return mod


msg = synthetic


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return msg.write_synthetic_gguf("tiny", tmp_path_factory.mktemp("synth") / "tiny.gguf", seed=1)


def test_tiny_metadata(tiny_path):
    md = GGUFFile(tiny_path).metadata
    c = msg.CONFIGS["tiny"]
    assert md["general.architecture"] == "qwen3"
    assert md["general.file_type"] == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert md["qwen3.block_count"] == c.layers
    assert md["qwen3.embedding_length"] == c.hidden
    assert md["qwen3.feed_forward_length"] == c.ffn
    assert md["qwen3.attention.head_count"] == c.heads
    assert md["qwen3.attention.head_count_kv"] == c.kv_heads
    assert md["qwen3.attention.key_length"] == md["qwen3.attention.value_length"] == c.head_dim
    assert md["qwen3.context_length"] == c.context
    assert md["qwen3.rope.freq_base"] == pytest.approx(1e6)
    assert md["qwen3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)

    tokens = md["tokenizer.ggml.tokens"]
    types = md["tokenizer.ggml.token_type"]
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen2"
    assert len(tokens) == len(types) == c.vocab == len(set(tokens))
    assert tokens[0] == "!" and "Ġ" in tokens[:256] and "Ċ" in tokens[:256]
    assert tokens[-3:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and types[-3:] == [3, 3, 3]
    assert set(types[:-3]) == {1}
    vocab = set(tokens)
    merges = md["tokenizer.ggml.merges"]
    assert merges and all(m.replace(" ", "") in vocab and all(p in vocab for p in m.split(" ")) for m in merges)
    assert tokens[md["tokenizer.ggml.bos_token_id"]] == "<|endoftext|>"
    assert tokens[md["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert "<|im_start|>" in md["tokenizer.chat_template"]


def test_tiny_tensors(tiny_path):
    plan = msg.tensor_plan("tiny")
    reader = GGUFReader(tiny_path)
    assert [t.name for t in reader.tensors] == [name for name, _, _ in plan]
    for t, (name, shape, qtype) in zip(reader.tensors, plan):
        assert QT(int(t.tensor_type)) == qtype, name
        assert tuple(int(d) for d in reversed(t.shape.tolist())) == shape, name
        assert int(t.n_bytes) == msg.tensor_nbytes(shape, qtype), name

    tensors = GGUFFile(tiny_path).tensors
    assert set(tensors) == {name for name, _, _ in plan}
    for name, shape, qtype in plan:
        qt = tensors[name]
        assert qt.qtype == qtype and qt.shape == shape, name
        x = qt.dequantize()
        assert x.shape == shape and np.isfinite(x).all(), name
        if qtype == QT.F32:
            assert 0.8 < x.mean() < 1.2, name
        else:
            assert abs(x.mean()) < 0.005 and 0.015 < x.std() < 0.025, (name, x.mean(), x.std())
    # both K-quant types appear: layer 1 of 2 is a use_more_bits layer
    assert tensors["blk.0.ffn_down.weight"].qtype == QT.Q4_K
    assert tensors["blk.1.ffn_down.weight"].qtype == QT.Q6_K
    assert tensors["blk.1.attn_v.weight"].qtype == QT.Q6_K


def test_blocks_scales_are_small_positive(tiny_path):
    tensors = GGUFFile(tiny_path).tensors
    q4 = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(-1, 144)
    d_dmin = np.ascontiguousarray(q4[:, 0:4]).view(np.float16).astype(np.float32)
    assert np.isfinite(d_dmin).all() and (d_dmin > 0).all() and (d_dmin < 1e-3).all()
    q6 = np.asarray(tensors["output.weight"].data).reshape(-1, 210)
    d = np.ascontiguousarray(q6[:, 208:210]).view(np.float16).astype(np.float32)
    assert np.isfinite(d).all() and (d > 0).all() and (d < 1e-3).all()
    assert np.isfinite(dequantize(q6, QT.Q6_K)).all()


def test_seed_determines_file(tmp_path, tiny_path):
    again = msg.write_synthetic_gguf("tiny", tmp_path / "a.gguf", seed=1)
    other = msg.write_synthetic_gguf("tiny", tmp_path / "b.gguf", seed=2)
    assert again.read_bytes() == tiny_path.read_bytes()
    assert other.read_bytes() != tiny_path.read_bytes()


def test_layers_override(tmp_path):
    path = msg.write_synthetic_gguf("tiny", tmp_path / "three.gguf", layers=3)
    f = GGUFFile(path)
    assert f.metadata["qwen3.block_count"] == 3
    assert "blk.2.attn_q.weight" in f.tensors and "blk.3.attn_q.weight" not in f.tensors
    # use_more_bits counts over the overridden layer count
    assert [f.tensors[f"blk.{i}.attn_v.weight"].qtype for i in range(3)] == [QT.Q4_K, QT.Q4_K, QT.Q6_K]


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert _load_tool().main(["--model", "tiny", "--out", str(out), "--seed", "3", "--layers", "1"]) == 0
    assert GGUFFile(out).metadata["qwen3.block_count"] == 1
    assert "MB/s" in capsys.readouterr().out


def test_unknown_model(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        msg.write_synthetic_gguf("qwen3-70b", tmp_path / "x.gguf")


def test_use_more_bits_rule():
    # llama.cpp's Q4_K_M rule for 36 and 28 layers: half of the layers get Q6_K
    assert [i for i in range(36) if msg.use_more_bits(i, 36)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27,
                                                                   30, 31, 32, 33, 34, 35]
    assert [i for i in range(28) if msg.use_more_bits(i, 28)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23,
                                                                  24, 25, 26, 27]


def test_qwen3_8b_plan():
    plan = msg.tensor_plan("qwen3-8b")
    by_name = {name: (shape, qtype) for name, shape, qtype in plan}
    assert len(plan) == 3 + 36 * 11
    assert by_name["token_embd.weight"] == ((151936, 4096), QT.Q4_K)
    assert by_name["output.weight"] == ((151936, 4096), QT.Q6_K)
    assert by_name["output_norm.weight"] == ((4096,), QT.F32)
    for i in range(36):
        more = QT.Q6_K if msg.use_more_bits(i, 36) else QT.Q4_K
        b = f"blk.{i}."
        assert by_name[b + "attn_q.weight"] == ((4096, 4096), QT.Q4_K)
        assert by_name[b + "attn_k.weight"] == ((1024, 4096), QT.Q4_K)
        assert by_name[b + "attn_v.weight"] == ((1024, 4096), more)
        assert by_name[b + "attn_output.weight"] == ((4096, 4096), QT.Q4_K)
        assert by_name[b + "ffn_gate.weight"] == ((12288, 4096), QT.Q4_K)
        assert by_name[b + "ffn_up.weight"] == ((12288, 4096), QT.Q4_K)
        assert by_name[b + "ffn_down.weight"] == ((4096, 12288), more)
        for norm, n in [("attn_norm", 4096), ("ffn_norm", 4096), ("attn_q_norm", 128), ("attn_k_norm", 128)]:
            assert by_name[b + norm + ".weight"] == ((n,), QT.F32)
    total = sum(msg.tensor_nbytes(shape, qtype) for _, shape, qtype in plan)
    assert 4.95e9 < total < 5.1e9  # llama.cpp's Qwen3-8B Q4_K_M file is about 5.03 GB


@pytest.mark.parametrize("model,hidden,layers,q_dim,ffn,gb", [
    ("qwen3-0.6b", 1024, 28, 2048, 3072, 0.39),
    ("qwen3-1.7b", 2048, 28, 2048, 6144, 1.10),
    ("qwen3-4b", 2560, 36, 4096, 9728, 2.49),
])
def test_tied_plans(model, hidden, layers, q_dim, ffn, gb):
    by_name = {name: (shape, qtype) for name, shape, qtype in msg.tensor_plan(model)}
    assert "output.weight" not in by_name
    assert by_name["token_embd.weight"] == ((151936, hidden), QT.Q6_K)  # takes the output's type
    assert by_name[f"blk.{layers - 1}.attn_q.weight"] == ((q_dim, hidden), QT.Q4_K)
    assert by_name[f"blk.{layers - 1}.ffn_down.weight"] == ((hidden, ffn), QT.Q6_K)
    assert f"blk.{layers}.attn_q.weight" not in by_name
    total = sum(msg.tensor_nbytes(s, q) for s, q in by_name.values())
    assert total == pytest.approx(gb * 1e9, rel=0.02)


def test_cached_synthetic_is_written_once(tmp_path, monkeypatch):
    """cached_synthetic_gguf writes the model into the cache the first time only, and says so."""
    monkeypatch.setenv("GLIMMER_CACHE", str(tmp_path))
    said = []
    path = msg.cached_synthetic_gguf("tiny", said.append)
    assert path == tmp_path / "synthetic-tiny.gguf" and path.is_file()
    assert len(said) == 1 and str(path) in said[0]
    stamp = path.stat().st_mtime_ns
    assert msg.cached_synthetic_gguf("tiny", said.append) == path
    assert len(said) == 1 and path.stat().st_mtime_ns == stamp

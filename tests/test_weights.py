"""GGUF loading: every supported type, and each kind of damaged file gets a one-line error."""

import gguf
import numpy as np
import pytest
from gguf_factory import tiny_model, write_gguf

from glimmer_cupy.errors import GGUFError, UnsupportedError
from glimmer_cupy.model.config import ModelConfig
from glimmer_cupy.weights import SUPPORTED_TYPES, GGUFFile, QType, load_safetensors
from glimmer_cupy.weights.random_blocks import random_blocks

QUANTIZABLE = [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0, QType.BF16]
K_TYPES = [QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K]


def test_every_type_loads(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (6, 512)).astype(np.float32)
    tensors = {"f32": (QType.F32, x, x.shape), "f16": (QType.F16, x.astype(np.float16), x.shape)}
    for q in QUANTIZABLE:
        tensors[q.name] = (q, gguf.quants.quantize(x, q), x.shape)
    for q in K_TYPES:
        tensors[q.name] = (q, random_blocks(q, 6, 512, rng, 0.5), x.shape)
    f = GGUFFile(write_gguf(tmp_path / "all.gguf", "llama", {}, tensors))
    assert {t.qtype for t in f.tensors.values()} == set(SUPPORTED_TYPES)
    for name, (q, data, shape) in tensors.items():
        t = f.tensors[name]
        assert t.shape == (6, 512) and t.qtype == q
        d = t.dequantize()
        assert d.shape == (6, 512) and d.dtype == np.float32 and np.isfinite(d).all()
        if q in (QType.F32, QType.F16) or q in QUANTIZABLE:
            # quantization error of each type, relative to the signal
            nmse = np.mean((d - x) ** 2) / np.mean(x ** 2)
            assert nmse < {QType.Q4_0: 1e-2, QType.Q4_1: 1e-2, QType.Q5_0: 3e-3, QType.Q5_1: 3e-3}.get(q, 1e-4), (q, nmse)
        else:
            assert np.array_equal(d, gguf.quants.dequantize(np.asarray(data), q).reshape(6, 512))
            assert d.std() > 0.05
        np.testing.assert_array_equal(t.rows(np.array([4, 1])), d[[4, 1]])


def test_metadata_and_config(tmp_path):
    f = GGUFFile(tiny_model(tmp_path / "m.gguf", "qwen3"))
    assert f.architecture == "qwen3" and f.metadata["qwen3.block_count"] == 3
    cfg = ModelConfig.from_gguf(f)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.qk_norm, cfg.rope_neox) == (4, 2, 32, True, True)


def one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_missing_and_not_gguf(tmp_path):
    with pytest.raises(GGUFError) as e:
        GGUFFile(tmp_path / "nope.gguf")
    assert "no such file" in one_line(e)
    bad = tmp_path / "text.gguf"
    bad.write_text("hello, world")
    with pytest.raises(GGUFError) as e:
        GGUFFile(bad)
    assert "not a GGUF file" in one_line(e) and "text.gguf" in one_line(e)


def test_truncated(tmp_path):
    path = tiny_model(tmp_path / "m.gguf", "llama")
    data = path.read_bytes()
    for cut in (len(data) - 1000, 200, 30):
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(data[:cut])
        with pytest.raises(GGUFError) as e:
            GGUFFile(short).tensors
        msg = one_line(e)
        assert "truncated" in msg or "damaged" in msg, msg


def test_tensor_bytes_do_not_fit_shape(tmp_path):
    x = np.ones((4, 32), np.float32)
    path = write_gguf(tmp_path / "s.gguf", "llama", {}, {"a": (QType.F32, x, x.shape), "b": (QType.F32, x, x.shape)})
    raw = bytearray(path.read_bytes())
    # tensor info of "a": name, n_dims=2, ne0=32, ne1=4 (uint64 each); make ne1 = 40
    at = raw.index(b"a" + (2).to_bytes(4, "little") + (32).to_bytes(8, "little"))
    ne1 = at + 1 + 4 + 8
    raw[ne1:ne1 + 8] = (40).to_bytes(8, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(GGUFError) as e:
        GGUFFile(path).tensors
    msg = one_line(e)
    assert "tensor a" in msg and "5120" in msg, msg


def test_unsupported_architecture_and_type(tmp_path):
    x = np.ones((4, 32), np.float32)
    f = GGUFFile(write_gguf(tmp_path / "a.gguf", "mamba", {}, {"a": (QType.F32, x, x.shape)}))
    with pytest.raises(UnsupportedError) as e:
        ModelConfig.from_gguf(f)
    assert "mamba" in one_line(e)
    q = gguf.GGMLQuantizationType.IQ4_NL
    raw = np.zeros((4, 18 * 2), np.uint8)                     # IQ4_NL: 18 bytes per 32 values
    f = GGUFFile(write_gguf(tmp_path / "t.gguf", "llama", {}, {"w": (q, raw, (4, 64))}))
    with pytest.raises(UnsupportedError) as e:
        f.tensors
    assert "IQ4_NL" in one_line(e) and "tensor w" in one_line(e)


def test_safetensors(tmp_path):
    from safetensors.numpy import save_file
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_file({"a": a, "h": a.astype(np.float16)}, str(tmp_path / "x.safetensors"))
    t = load_safetensors(tmp_path / "x.safetensors")
    np.testing.assert_array_equal(t["a"].dequantize(), a)
    np.testing.assert_array_equal(t["h"].dequantize(), a)

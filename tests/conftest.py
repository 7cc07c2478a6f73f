"""Shared fixtures: the real model files (marker `model`), found or fetched by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODEL_FILES = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
}


def _model_path(name: str) -> Path:
    try:
        from glimmer_cupy.weights.fetch import resolve_model
    except ImportError:  # no fetcher: look in the cache folder only
        path = Path(os.environ.get("GLIMMER_CACHE", REPO / "weights")) / MODEL_FILES[name]
        if not path.is_file():
            pytest.skip(f"model file {path} is not there")
        return path
    from glimmer_cupy.errors import GlimmerError
    try:
        return resolve_model(name)
    except GlimmerError as e:
        pytest.skip(f"model {name} is not available: {e}")


@pytest.fixture(scope="session")
def model_file():
    """model_file(name) -> path of a real model file ('smollm2-135m', 'gemma3-270m'); skips if absent."""
    return _model_path


@pytest.fixture(scope="session")
def gguf_metadata(model_file):
    """gguf_metadata(name) -> the file's metadata dict, read once per session."""
    from glimmer_cupy.weights import GGUFFile

    cache = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = GGUFFile(model_file(name)).metadata
        return cache[name]
    return get


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip cleanly on machines without a CUDA device."""
    from glimmer_cupy.runtime.device import cuda_device_count

    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

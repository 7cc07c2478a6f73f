"""The decoder's L2 prefetch ranges (model/decoder.py: prefetch_ranges) and ops/prefetch.py on the host."""

from types import SimpleNamespace

import numpy as np

from glimmer_cupy.model import decoder
from glimmer_cupy.ops.prefetch import NO_PREFETCH, l2_ranges, prefetch_args


def layer(*sizes):
    return SimpleNamespace(parts=[SimpleNamespace(nbytes=n, name=f"p{n}") for n in sizes])


def test_budget_takes_parts_in_order(monkeypatch):
    """The first layer's part whole, then the prefix of the second's the budget leaves, nothing of the
    third's; at most three ranges."""
    monkeypatch.setattr(decoder, "l2_ranges", lambda *parts: [(p.name, n) for p, n in parts])
    o, gate_up, down = layer(1000), layer(5000), layer(3000)
    assert decoder.prefetch_ranges([o, gate_up, down], 2500) == [("p1000", 1000), ("p5000", 1500)]
    assert decoder.prefetch_ranges([o, gate_up, down], 6000) == [("p1000", 1000), ("p5000", 5000)]
    assert decoder.prefetch_ranges([o, gate_up, down], 10 ** 9) == [("p1000", 1000), ("p5000", 5000),
                                                                   ("p3000", 3000)]
    assert decoder.prefetch_ranges([o, gate_up, down], 0) is None
    # a layer of two parts (q|k beside v) counts each; the fourth part is left out
    two = layer(10, 20)
    assert decoder.prefetch_ranges([two, two], 10 ** 9) == [("p10", 10), ("p20", 20), ("p10", 10)]


def test_host_arrays_prefetch_nothing():
    """The reference path has no cache to warm: host arrays give None, and None gives null pairs."""
    w = np.zeros(4096, np.uint8)
    assert l2_ranges((w, 4096)) is None
    assert prefetch_args(None) == NO_PREFETCH and len(NO_PREFETCH) == 6

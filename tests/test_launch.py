"""Kernel launches (kernels/launch.py) on the CPU: which kernels may launch with programmatic
dependent launch, how arguments are passed to the driver, and which path a call takes. The
PDL launches themselves run on the GPU in every static step of the executor's tests."""

from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace

import numpy as np
import pytest

from glimmer_cupy.kernels import launch
from glimmer_cupy.kernels.build import CUDA_SRC, PDL_SOURCES

KERNEL = re.compile(r"__global__[^;{]*\{")
BODY_CALL = re.compile(r"^\s*(\w+_body)\s*(<[^;]*?>)?\s*\(")     # a kernel whose body is one call: foo_body<...>(...)
# a kernel whose body picks one of two calls of the same body by its block: if (blockIdx...) foo_body<...>(...); else ...
BODY_PICK = re.compile(r"^\s*if \(\(int\)blockIdx\.x < \w+\)\s*(\w+_body)\s*(<[^;]*?>)?\s*\([^;]*;\s*else\s*\1\s*<[^;]*?>\s*\([^;]*;\s*\}?\s*$")


def braced(src: str, start: int) -> str:
    """The text from start (just after an opening brace) to its matching closing brace."""
    depth, i = 1, start
    while depth:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    return src[start:i]


def kernel_bodies(src: str):
    """(kernel name, body) of every __global__ definition (explicit instantiations skipped); a
    kernel that only calls a __device__ function `*_body` of the same source gets that body, and one
    that picks between calls of one such function by its block index (gemv_kq_pair_kernel) too.
    Kernels defined by a macro are read with its line continuations taken out."""
    src = re.sub(r"\s*\\\n", "\n", src)
    for m in KERNEL.finditer(src):
        line = src[src.rfind("\n", 0, m.start()) + 1:m.start()]
        if line.lstrip().startswith("//"):
            continue
        body = braced(src, m.end())
        names = [n for n in re.findall(r"(\w+)\s*\(", src[m.start():m.end()])
                 if n not in ("__launch_bounds__", "__cluster_dims__")]
        call = BODY_CALL.match(body) or BODY_PICK.match(body)
        if call:
            d = re.search(r"__device__[^;{]*\b" + call.group(1) + r"\s*\([^{]*\{", src)
            assert d, f"{names[0]} calls {call.group(1)}, which this source does not define"
            body = braced(src, d.end())
        yield names[0], body


# what may come before pdl_wait() in any kernel: letting the next kernel launch, and probe stamps
# (cuda_src/stamps.cuh: nothing without GLIMMER_STAMPS)
NOT_DATA = re.compile(r"^\s*(pdl_release\(\);|STAMP\(\d+\);|STAMP_ROW\([^;]*\);)\s*(//.*)?$", re.M)


# kernels that do work before they wait, and (regexes) what must not come before the wait: any
# write, and any read of another kernel's output
KQ_EARLY = (r"\by\[", r"load_x", r"partial", r"__syncthreads", r"atomic", r"\bx[qds]\b")
EARLY_FETCH = {
    "gemv_kq_kernel": KQ_EARLY,
    "gemv_kq_occ_kernel": KQ_EARLY,
    "gemv_kq_pair_kernel": KQ_EARLY,
    # the first super-block of W into registers, the next ones asked into L2; x is staged after
    "mma_dq_kernel": (r"\by\[", r"stage_x", r"(?<![.\w])x\s*\[", r"\bx\s*\+", r"part\[", r"__syncthreads",
                      r"cluster_", r"smem\b"),
    # the barriers set up and W's bulk copies issued; x's stages, the multiplies and every write after
    "mma_st_kernel": (r"\by\[", r"\bxst\b", r"mma_u8s8", r"mma_s8s8", r"part\[", r"cluster_", r"mbar_wait",
                      r"\bacc\["),
    # the barriers and W's tensor-map copies, one a chunk; as mma_st_kernel otherwise
    "mma_st_tma_kernel": (r"\by\[", r"\bxst\b", r"mma_u8s8", r"mma_s8s8", r"part\[", r"cluster_", r"mbar_wait",
                          r"\bacc\[", r"chunk_(block|pair)"),
    # the first super-block of W into registers; x's stages and every write after the wait
    "mma_wg_kernel": (r"\by\[", r"cp_async", r"issue\(", r"\bx[ps]\b", r"mma_rs", r"step\(", r"__syncthreads"),
    # the offsets table, the barriers and layer 0's rows of every matrix (bulk copies of weights); the
    # token, the step's indices, the pools and every exchange after the wait
    "decode_stack_kernel": (r"x_in", r"positions\[", r"cells\[", r"cell_table", r"seq_lens", r"_out\[",
                            r"mat_rows", r"st_async", r"stage\(", r"_pool", r"\bkw\[", r"\bvw\[", r"attend_tile",
                            r"pcells\[", r"ctab", r"\bx\[", r"_codes\("),
    "gemv_dp4a_kernel": (r"\by\[", r"dp4a_pass", r"store_row_sums", r"\bx[qds]\b", r"atomic"),
    # the warp's rows of W copied into its shared memory (cp.async, not waited on); x after the wait
    "gemv_staged_kernel": (r"\by\[", r"__dp4a", r"\bx[qds]\b", r"cp_wait", r"atomic", r"__syncthreads"),
    # index arrays and the cell table are uploaded before the step's kernels; K/V rows only prefetched
    # the weights into L1; the RoPE angles from the uploaded positions
    "rms_norm_kernel": (r"(?<![.\w])x\s*\[", r"\bxr\s*\[", r"\bout\b", r"red\[", r"__syncthreads", r"row_sum",
                        r"\bx[qds]\b"),
    "add_rms_norm_kernel": (r"\bresidual\s*\[", r"\bdelta\s*\[", r"\brr\s*\[", r"\bdr\s*\[", r"\bout\b", r"red\[",
                            r"__syncthreads", r"row_sum", r"\bx[qds]\b"),
    "prepare_qkv_kernel": (r"\bqkv\s*\[", r"\bsrc\s*\[", r"(?<![.\w])x\s*\[", r"\bdst\b", r"_out\s*\[",
                           r"_pool\s*\[", r"_norm\s*\["),
    "attn_kernel": (r"\bq\[", r"\bout\[", r"part_acc", r"part_ml", r"\bsq\[", r"\bsp\[", r"\bsacc\[",
                    r"\bsml\[", r"__ldg", r"k_pool\[", r"v_pool\[", r"\bkb\[", r"\bvb\[", r"\bx[qds]\b",
                    r"atomic", r"counter", r"__syncthreads"),
    # K/V rows of positions below the step's lowest new one start copying (cp.async, not waited on)
    "attn_mma_kernel": (r"[(\s]q\s*\+", r"\bq\[", r"\bout\[", r"part_acc\[", r"part_ml\[", r"end_row", r"merge\w*\(",
                        r"\bsQ\b\s*\+", r"atomic", r"counter", r"\bx[qds]\b", r"mma_bf16", r"cp_wait", r"k_pool\[",
                        r"v_pool\[", r"issue\([^)]*k(All|New)Rows", r"cluster_sync"),
    # the block's token indices (the step's upload); q, K/V and every write after the wait
    "attn_wgmma_kernel": (r"[(\s]q\s*\+", r"\bq\[", r"\bout\[", r"part_acc\[", r"part_ml\[", r"end_block",
                          r"atomic", r"counter", r"\bx[qds]\b", r"mma_rs", r"cp_async", r"issue\(",
                          r"k_pool\[", r"v_pool\["),
    # the copies of the first tiles wholly below the step's lowest new position (not waited on)
    "attn_stream_kernel": (r"[(\s]q\s*\+", r"\bq\[", r"\bout\[", r"part_acc\[", r"part_ml\[", r"end_\w+\(",
                           r"\bsQ\b\s*\+", r"atomic", r"counter", r"\bx[qds]\b", r"mma_bf16", r"cp_wait",
                           r"k_pool\[", r"v_pool\[", r"cluster_sync"),
}


@pytest.mark.parametrize("name", sorted(PDL_SOURCES))
def test_pdl_sources_wait_before_touching_data(name):
    """A kernel launched with PDL must wait for the kernel before it: every kernel of a PDL source
    calls pdl_wait() first (pdl_release() and probe stamps aside), or (EARLY_FETCH) after loads of
    weights only."""
    src = (CUDA_SRC / f"{name}.cu").read_text()
    bodies = list(kernel_bodies(src))
    assert bodies, f"{name}.cu defines no kernel"
    for sig, body in bodies:
        assert "pdl_wait();" in body, f"{name}.cu: {sig} never calls pdl_wait()"
        before = NOT_DATA.sub("", body[:body.index("pdl_wait();")])
        if sig in EARLY_FETCH:
            code = "\n".join(ln for ln in before.splitlines() if "__shared__" not in ln)   # declarations
            bad = [t for t in EARLY_FETCH[sig] if re.search(t, code)]
            assert not bad, f"{name}.cu: {sig} touches {bad} before pdl_wait()"
        else:
            assert not before.strip(), f"{name}.cu: {sig} runs code before pdl_wait(): {before.strip()[:80]}"


def test_every_waiting_source_is_in_the_set():
    """A source whose kernels all wait is in PDL_SOURCES (else its kernels launch plainly for nothing)."""
    for path in CUDA_SRC.glob("*.cu"):
        bodies = list(kernel_bodies(path.read_text()))
        if bodies and all("pdl_wait();" in b for _, b in bodies):
            assert path.stem in PDL_SOURCES, path.name


def test_arguments_convert_as_cupy_passes_them():
    arr = SimpleNamespace(data=SimpleNamespace(ptr=0x7F00_0000_1000))
    v = launch._c_arg(arr)
    assert isinstance(v, ctypes.c_void_p) and v.value == 0x7F00_0000_1000
    for value, ctype in ((np.int32(-3), ctypes.c_int32), (np.int64(1 << 40), ctypes.c_int64),
                         (np.float32(0.5), ctypes.c_float), (np.uint64(7), ctypes.c_uint64),
                         (5, ctypes.c_int64), (0.25, ctypes.c_double)):
        got = launch._c_arg(value)
        assert ctypes.sizeof(got) == ctypes.sizeof(ctype) and got.value == value, (value, got)
    words = (ctypes.c_uint64 * 16)(*range(16))             # a tensor map: its 128 bytes by value
    assert launch._c_arg(words) is words
    with pytest.raises(TypeError, match="kernel argument of type str"):
        launch._c_arg("x")


def test_launch_config_layout_matches_cuda_h():
    assert ctypes.sizeof(launch._Attr) == 72                 # id, pad to 8, 64-byte value union
    assert launch._Config.stream.offset == 32 and launch._Config.n_attrs.offset == 48
    attr = launch._pdl_attr()
    assert attr.id == 6 and int.from_bytes(bytes(attr)[8:12], "little") == 1


class _FakeDriver:
    """cuLaunchKernelEx that records what it was given (and can refuse), for the launch paths on
    the CPU."""

    def __init__(self, rc: int = 0):
        self.rc, self.seen = rc, []

    def cuLaunchKernelEx(self, cfg_ref, ptr, params, extra):
        cfg = ctypes.cast(cfg_ref, ctypes.POINTER(launch._Config)).contents
        attrs = [cfg.attrs[i] for i in range(cfg.n_attrs)]
        first = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_int32)).contents.value if len(params) else None
        self.seen.append(dict(grid=tuple(cfg.grid), block=tuple(cfg.block), smem=cfg.shared_mem, stream=cfg.stream,
                              ids=[a.id for a in attrs], values=[bytes(a)[8:20] for a in attrs], ptr=ptr, first=first))
        return self.rc

    def cuGetErrorName(self, rc, out):
        out._obj.value = b"CUDA_ERROR_CLUSTER_TOO_BIG"
        return 0


@pytest.mark.parametrize("overlap", [False, True])
def test_pdl_and_cluster_launches_fill_the_driver_config(monkeypatch, overlap):
    drv = _FakeDriver()
    monkeypatch.setattr(launch, "_driver", lambda: drv)
    monkeypatch.setattr(launch, "_current_stream", lambda: 0x1234)
    fn = SimpleNamespace(ptr=0xABC)
    launch.launch_pdl(fn, "k", (3,), (128,), (np.int32(7),), shared_mem=96)
    with launch.overlapped(overlap):
        launch.launch_cluster(launch.Kernel(fn, "c", True), (4, 2), (256,), (np.int32(9),), 64, (1, 2, 1))
    pdl = dict(grid=(3, 1, 1), block=(128, 1, 1), smem=96, stream=0x1234, ids=[6],
               values=[(1).to_bytes(4, "little") + bytes(8)], ptr=0xABC, first=7)
    dims = b"".join(v.to_bytes(4, "little") for v in (1, 2, 1))
    cluster = dict(grid=(4, 2, 1), block=(256, 1, 1), smem=64, stream=0x1234, ids=[4, 6] if overlap else [4],
                   values=[dims] + ([pdl["values"][0]] if overlap else []), ptr=0xABC, first=9)
    assert drv.seen == [pdl, cluster]


@pytest.mark.parametrize("policy", ["spread", "load-balancing"])
def test_a_cluster_policy_rides_with_the_cluster_shape(monkeypatch, policy):
    drv = _FakeDriver()
    monkeypatch.setattr(launch, "_driver", lambda: drv)
    monkeypatch.setattr(launch, "_current_stream", lambda: 0)
    monkeypatch.setattr(launch, "CLUSTER_POLICY", launch.CLUSTER_POLICIES[policy])
    with launch.overlapped(True):
        launch.launch_cluster(launch.Kernel(SimpleNamespace(ptr=1), "c", True), (16,), (128,), (), 0, (16, 1, 1))
    (seen,) = drv.seen
    assert seen["ids"] == [4, 5, 6]                    # shape, placement, PDL (CUlaunchAttributeID)
    assert seen["values"][1] == {"spread": 1, "load-balancing": 2}[policy].to_bytes(4, "little") + bytes(8)


def test_a_refused_launch_names_the_kernel_and_the_error(monkeypatch):
    monkeypatch.setattr(launch, "_driver", lambda: _FakeDriver(rc=801))
    monkeypatch.setattr(launch, "_current_stream", lambda: 0)
    kern = launch.Kernel(SimpleNamespace(ptr=1), "mma_dq_kernel<2, 4>", True)
    with pytest.raises(launch.KernelLaunchError, match=r"cluster launch of mma_dq_kernel<2, 4> failed: "
                                                       r"CUDA_ERROR_CLUSTER_TOO_BIG \(801\)"):
        launch.launch_cluster(kern, (1,), (32,), (), 0, (2, 1, 1))
    with pytest.raises(launch.KernelLaunchError, match=r"^launch of k failed"):
        launch.launch_pdl(SimpleNamespace(ptr=1), "k", (1,), (32,), ())


def test_calls_take_pdl_only_inside_overlapped_and_for_ready_kernels(monkeypatch):
    calls = []
    fn = lambda grid, block, args, shared_mem=0: calls.append(("plain", grid, shared_mem))  # noqa: E731
    monkeypatch.setattr(launch, "launch_pdl", lambda f, name, grid, block, args, shared_mem=0:
                        calls.append(("pdl", grid, shared_mem)))
    ready, other = launch.Kernel(fn, "k", True), launch.Kernel(fn, "s", False)
    ready((1,), (32,), ())
    with launch.overlapped():
        ready((2,), (32,), (), shared_mem=16)
        other((3,), (32,), ())
        with launch.overlapped(False):
            ready((4,), (32,), ())
    ready((5,), (32,), ())
    assert calls == [("plain", (1,), 0), ("pdl", (2,), 16), ("plain", (3,), 0), ("plain", (4,), 0),
                     ("plain", (5,), 0)]


def test_probe_stamp_shape_is_the_sources():
    """bench/stamp_stats.py reads glimmer_stamps with the shape cuda_src/stamps.cuh declares."""
    import importlib.util
    path = CUDA_SRC.parent / "bench" / "stamp_stats.py"
    spec = importlib.util.spec_from_file_location("stamp_stats", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = re.search(r"kStampBlocks = (\d+), kStamps = (\d+);", (CUDA_SRC / "stamps.cuh").read_text())
    assert m and mod.STAMP_SHAPE == (int(m.group(1)), int(m.group(2)))


def test_added_defines_reach_every_compile(monkeypatch):
    """build.add_defines (the probes' GLIMMER_STAMPS, knockout_decode --define) puts -DNAME=1 into
    the options of every module compiled after it, beside the module's own defines."""
    import glimmer_cupy.kernels.build as build
    monkeypatch.setattr(build, "_EXTRA_DEFINES", [])
    assert not any(o.startswith("-DGLIMMER_STAMPS") for o in build.compile_options("norm", (("X", 2),)))
    build.add_defines("GLIMMER_STAMPS")
    opts = build.compile_options("norm", (("X", 2),))
    assert "-DGLIMMER_STAMPS=1" in opts and "-DX=2" in opts


def test_a_module_hash_covers_what_it_includes(monkeypatch, tmp_path):
    """The cache key of a module (its GLIMMER_SRC_HASH) follows its source and every header it
    includes, directly or through another header, and no other file: an edit recompiles only the
    modules that see it."""
    import glimmer_cupy.kernels.build as build
    (tmp_path / "a.cu").write_text('#include "x.cuh"\n  # include "cycle.cuh"\n#include <cuda_bf16.h>\n')
    (tmp_path / "x.cuh").write_text('#include "y.cuh"  // comment\n')
    (tmp_path / "y.cuh").write_text("int y;\n")
    (tmp_path / "cycle.cuh").write_text('#include "cycle.cuh"\n')
    (tmp_path / "z.cuh").write_text("int z;\n")
    monkeypatch.setattr(build, "CUDA_SRC", tmp_path)

    def key():
        build._sources_hash.cache_clear()
        return build.compile_options("a")[2]

    first = key()
    assert first.startswith("-DGLIMMER_SRC_HASH=0x")
    (tmp_path / "z.cuh").write_text("int z2;\n")
    assert key() == first
    for f in ("y.cuh", "x.cuh", "a.cu", "cycle.cuh"):
        (tmp_path / f).write_text((tmp_path / f).read_text() + "// edited\n")
        now = key()
        assert now != first, f
        first = now
    build._sources_hash.cache_clear()

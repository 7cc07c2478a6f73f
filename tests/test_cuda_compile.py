"""Every cuda_src/*.cu compiles with nvcc for sm_90, and ptxas reports no register spills.

Runs on CPU wherever `nvcc` is on PATH (skipped otherwise). At run time the kernels are
templates instantiated by NVRTC through `name_expressions`; offline, nvcc would compile no
template at all, so the convention is that each .cu instantiates every variant explicitly under
`#ifdef GLIMMER_INSTANTIATE`, and this test compiles with `-DGLIMMER_INSTANTIATE`.
A second test compiles the exact name expressions the ops modules ask NVRTC for, so a name the
Python side spells differently from the template fails here rather than on the GPU.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.code_size import nvcc_command, text_sizes

REPO = Path(__file__).resolve().parents[1]
CUDA_SRC = REPO / "cuda_src"
NVCC = shutil.which("nvcc")

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")

# ops module -> cuda_src file whose name expressions it uses
OPS_SOURCES = {"norm": "norm", "rope": "rope", "activation": "activation", "embed": "embed", "attention": "attention",
               "prepare_qkv": "prepare_qkv"}


def compile_cubin(src: Path, out_dir: Path, defines=()) -> tuple[int, str]:
    cmd = nvcc_command(src, out_dir / (src.stem + ".cubin"), defines, ("-Xptxas", "-v"), nvcc=NVCC)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """{mangled kernel: {'registers', 'spill_stores', 'spill_loads', 'stack'}} from -Xptxas -v. A
    function a kernel calls (not inlined) gets its own entry, '<kernel> calls <function>': ptxas
    reports its frame after the kernel's and before the kernel's registers."""
    kernels: dict[str, dict[str, int]] = {}
    entry = current = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entry = m.group(1)
            current = kernels.setdefault(entry, {})
            continue
        if entry is None:
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            current = kernels.setdefault(entry if name == entry else f"{entry} calls {name}", {})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            kernels[entry]["registers"] = int(m.group(1))
    return kernels


def assert_no_spills(kernels: dict[str, dict[str, int]], what: str) -> None:
    spilled = {k: v for k, v in kernels.items() if v.get("spill_stores", 0) or v.get("spill_loads", 0)}
    assert not spilled, f"{what}: register spills in {spilled}"
    missing = [k for k, v in kernels.items() if "spill_stores" not in v]
    assert not missing, f"{what}: no ptxas spill line for {missing}"


# ptxas -v's order for a kernel that calls a function it did not inline: the kernel's frame, then the
# function's, then the kernel's registers (as this project's nvcc printed it for sample_rows_c8 at 8582393)
PTXAS_CALL_LOG = """ptxas info    : Compiling entry function 'k_spills' for 'sm_90a'
ptxas info    : Function properties for k_spills
    8 bytes stack frame, 8 bytes spill stores, 28 bytes spill loads
ptxas info    : Function properties for _Z4helpv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 3 barriers, 8 bytes cumulative stack size
ptxas info    : Compiling entry function 'k_clean' for 'sm_90a'
ptxas info    : Function properties for k_clean
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers
"""


def test_a_called_functions_frame_does_not_hide_the_kernels_spills():
    kernels = ptxas_report(PTXAS_CALL_LOG)
    assert kernels["k_spills"] == dict(stack=8, spill_stores=8, spill_loads=28, registers=64)
    assert kernels["k_spills calls _Z4helpv"] == dict(stack=0, spill_stores=0, spill_loads=0)
    assert kernels["k_clean"]["registers"] == 40
    with pytest.raises(AssertionError, match="k_spills"):
        assert_no_spills(kernels, "the log")
    assert_no_spills({k: v for k, v in kernels.items() if k != "k_spills"}, "the log without k_spills")


@pytest.mark.parametrize("src", sorted(CUDA_SRC.glob("*.cu")), ids=lambda p: p.name)
def test_cu_compiles_without_spills(src: Path, tmp_path: Path):
    rc, log = compile_cubin(src, tmp_path, defines=("GLIMMER_INSTANTIATE",))
    assert rc == 0, f"nvcc failed on {src.name}:\n{log}"
    kernels = ptxas_report(log)
    assert kernels, (f"{src.name}: nvcc compiled no kernel; instantiate every template variant "
                     f"under #ifdef GLIMMER_INSTANTIATE (see norm.cu)")
    assert_no_spills(kernels, src.name)


def test_arch_specific_sources_hold_warpgroup_multiplies(tmp_path: Path):
    """The sm_90a modules really compile their wgmma code for sm_90a (it is guarded by
    __CUDA_ARCH_FEAT_SM90_ALL, so a plain sm_90 build would compile empty kernels), and ptxas
    serialises none of their multiplies."""
    from glimmer_cupy.kernels.build import ARCH_SPECIFIC
    for name in sorted(ARCH_SPECIFIC):
        src = CUDA_SRC / f"{name}.cu"
        ptx = tmp_path / f"{name}.ptx"
        cmd = nvcc_command(src, ptx, ("GLIMMER_INSTANTIATE",), nvcc=NVCC, kind="ptx")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert "wgmma.mma_async" in ptx.read_text(), f"{name}.cu: no wgmma in its sm_90a PTX"
        rc, log = compile_cubin(src, tmp_path, defines=("GLIMMER_INSTANTIATE",))
        assert rc == 0 and "serialized" not in log, log


# A warpgroup multiply with A from registers reads them asynchronously; at head dim 64 ptxas gave the
# registers of attn_wgmma_kernel's loop-invariant q fragments to other values inside the tile loop,
# so every tile after the first was multiplied by the last tile's P (wrong outputs on the GPU, NMSE
# 6-68). sass_by_source.loop_clobbers finds such registers in the listing, and inflight_clobbers
# registers of a multiply (A or accumulators) written before the wait for it: ptxas gave the
# softmax's temporaries the registers of a P still being read where the softmax ran beside O += P V.
REGISTER_A = r"HGMMA\.\S+ R\d+, R(\d+), gdesc"


@pytest.mark.parametrize("module", ["attention_wgmma", "mma_wg"])
def test_warpgroup_register_operands_live_through_their_loops(module: str, tmp_path: Path):
    """Every kernel of the sm_90a modules that multiplies with A from registers inside a loop either
    defines those registers again on each pass or never writes them inside the loop, and writes
    none of a multiply's registers before waiting for it."""
    sys.path.insert(0, str(REPO / "bench"))          # sass_by_source imports code_size as the scripts do
    from code_size import nvdisasm_path
    from sass_by_source import inflight_clobbers, loop_clobbers
    nvdisasm = nvdisasm_path()
    if nvdisasm is None:
        pytest.skip("nvdisasm is neither on PATH nor installed by pip (nvidia-cuda-nvdisasm)")
    rc, log = compile_cubin(CUDA_SRC / f"{module}.cu", tmp_path, defines=("GLIMMER_INSTANTIATE",))
    assert rc == 0, log
    sass = subprocess.run([nvdisasm, "-c", str(tmp_path / f"{module}.cubin")], capture_output=True, text=True,
                          check=True).stdout
    kernels = [k for k in re.findall(r"^\.text\.(\S+):", sass, re.M)
               if re.search(REGISTER_A, sass.split(f".text.{k}:")[1].split(".text.")[0])]
    assert kernels, f"{module}.cu: no warpgroup multiply with A from registers"
    for kernel in kernels:
        assert loop_clobbers(sass, kernel, REGISTER_A, 4) == [], kernel
        assert inflight_clobbers(sass, kernel) == [], kernel


@pytest.mark.parametrize("module", sorted(OPS_SOURCES))
def test_name_expressions_compile(module: str, tmp_path: Path):
    """The strings ops/<module>.py hands NVRTC name real template instantiations, all spill-free."""
    exprs = importlib.import_module(f"glimmer_cupy.ops.{module}")._EXPRS
    assert len(set(exprs)) == len(exprs)
    src = tmp_path / f"{module}_names.cu"
    src.write_text(f'#include "{OPS_SOURCES[module]}.cu"\n'
                   "void* glimmer_name_expressions[] = {\n"
                   + "".join(f"    (void*)&{e},\n" for e in exprs) + "};\n")
    rc, log = compile_cubin(src, tmp_path)
    assert rc == 0, f"the name expressions of ops/{module}.py do not compile:\n{log}"
    kernels = ptxas_report(log)
    assert len(kernels) == len(exprs), f"{len(exprs)} name expressions, {len(kernels)} kernels: {sorted(kernels)}"
    assert_no_spills(kernels, f"ops/{module}.py")


@pytest.mark.parametrize("trait", ["Q4_K", "Q6_K", "Q6_KP"])
def test_gemv_kq_table_compiles_without_spills(trait: str, tmp_path: Path):
    """Every gemv_kq instance the M table of ops/matmul.py picks (rows of W per warp by M; the
    occupancy kernel where KQ_OCCUPANCY names the type and M; the type's own rows at M = 1), for
    Q6_K in pair order (Q6_KP) as for Q6_K, with the switches the library builds the module with."""
    from glimmer_cupy.ops.matmul import DP4A_WIDTHS, KQ_DEFINES, KQ_SPLITS, kq_kernel_name, kq_occupancy, kq_rows
    from glimmer_cupy.weights.quant_tensor import QType
    q = QType["Q6_K" if trait == "Q6_KP" else trait]
    exprs = [kq_kernel_name(trait, m, kq_rows(m), s, kq_occupancy(q, m, 1024, 1024, kq_rows(m)))
             for m in DP4A_WIDTHS for s in KQ_SPLITS]
    m1 = kq_rows(1, q)
    exprs += [kq_kernel_name(trait, 1, m1, s) for s in KQ_SPLITS if m1 != kq_rows(1)]
    src = tmp_path / "gemv_kq_names.cu"
    src.write_text('#include "gemv_kq.cu"\nvoid* glimmer_name_expressions[] = {\n'
                   + "".join(f"    (void*)&{e},\n" for e in exprs) + "};\n")
    rc, log = compile_cubin(src, tmp_path, defines=tuple(f"{k}={v}" for k, v in KQ_DEFINES.items()))
    assert rc == 0, f"the gemv_kq instances of the M table do not compile:\n{log}"
    kernels = ptxas_report(log)
    assert len(kernels) == len(exprs)
    assert_no_spills(kernels, f"gemv_kq {trait}")


def test_probe_stamps_compile(tmp_path: Path):
    """The stage stamps bench/probe_attention_decode.py and probe_attention_stream.py build in
    (GLIMMER_STAMPS, cuda_src/stamps.cuh) compile into prepare_qkv and both decode attention
    kernels, and spill nothing there either."""
    src = tmp_path / "stamped.cu"
    src.write_text('#include "prepare_qkv.cu"\n#include "attention_mma.cu"\n#include "attention_stream.cu"\n'
                   "void* glimmer_name_expressions[] = {\n"
                   "    (void*)&prepare_qkv_kernel<128, true, true>,\n    (void*)&attn_mma_kernel<128, 1, 2>,\n"
                   "    (void*)&attn_stream_kernel<128, 3>,\n};\n")
    rc, log = compile_cubin(src, tmp_path, defines=("GLIMMER_STAMPS",))
    assert rc == 0, f"the stamped kernels do not compile:\n{log}"
    kernels = ptxas_report(log)
    assert len(kernels) == 3
    assert_no_spills(kernels, "stamped kernels")


def test_wgmma_phases_compile(tmp_path: Path):
    """attn_wgmma_kernel's phase counters for bench/probe_attention_wgmma.py (GLIMMER_STAMPS) compile
    for sm_90a at every head dim and depth, spill nothing, and serialise no multiply."""
    rc, log = compile_cubin(CUDA_SRC / "attention_wgmma.cu", tmp_path, defines=("GLIMMER_INSTANTIATE", "GLIMMER_STAMPS"))
    assert rc == 0, f"attention_wgmma.cu does not compile with its phase counters:\n{log}"
    assert "serialized" not in log, log
    kernels = ptxas_report(log)
    from glimmer_cupy.ops.attention import WGMMA_VARIANTS
    assert len(kernels) == len(WGMMA_VARIANTS)
    assert_no_spills(kernels, "attn_wgmma_kernel with its phase counters")


@pytest.mark.parametrize("module,define", [("gemv_kq", "GEMV_WEIGHTS_L2_256B"), ("attention_stream", "ATTN_KV_L2_256B"),
                                           ("attention_stream", "ATTN_KV_L2_128B")])
def test_load_hint_switches_compile(module: str, define: str, tmp_path: Path):
    """The switches that put L2's prefetch-size hint on the weights' loads (kq_lanes.cuh; gemv_kq's
    module is built with it) or on decode attention's K/V copies (attn_mma_ptx.cuh, for A/Bs) compile
    without spills, and the hint is in the PTX."""
    rc, log = compile_cubin(CUDA_SRC / f"{module}.cu", tmp_path, defines=("GLIMMER_INSTANTIATE", define))
    assert rc == 0, f"{module}.cu does not compile with {define}:\n{log}"
    assert_no_spills(ptxas_report(log), f"{module} with {define}")
    ptx = tmp_path / f"{module}.ptx"
    proc = subprocess.run(nvcc_command(CUDA_SRC / f"{module}.cu", ptx, ("GLIMMER_INSTANTIATE", define), nvcc=NVCC,
                                       kind="ptx"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    size = define.rsplit("_", 1)[1]                  # 256B / 128B
    assert f".L2::{size}" in ptx.read_text(), f"{module}.cu with {define}: no .L2::{size} load in its PTX"


@pytest.mark.parametrize("module,define", [("attention_mma", "ATTN_MMA_PADDED_TILES"),
                                           ("attention_stream", "ATTN_STREAM_PADDED_RING")])
def test_kv_layout_switches_compile(module: str, define: str, tmp_path: Path):
    """The padded K/V tile rows the A/Bs build beside the default swizzled ones (attn_mma_kernel's
    tiles and attn_stream_kernel's ring; at head dim 256 attn_mma_kernel is within a few registers
    of the cap either way) compile without spills."""
    rc, log = compile_cubin(CUDA_SRC / f"{module}.cu", tmp_path, defines=("GLIMMER_INSTANTIATE", define))
    assert rc == 0, f"{module}.cu does not compile with {define}:\n{log}"
    kernels = ptxas_report(log)
    assert kernels, f"{module}.cu with {define}: no kernel compiled"
    assert_no_spills(kernels, f"{module} with {define}")


@pytest.mark.parametrize("module", ["norm", "activation", "gemv_kq", "embed"])
def test_launch_log_compiles(module: str, tmp_path: Path):
    """The launch log in pdl_wait (cuda_src/pdl.cuh, for bench/probe_decode_stamps.py) compiles into
    the kernels of a decode step that have no stage stamps, with no spills."""
    rc, log = compile_cubin(CUDA_SRC / f"{module}.cu", tmp_path, defines=("GLIMMER_INSTANTIATE", "GLIMMER_STAMPS"))
    assert rc == 0, f"{module}.cu does not compile with the launch log:\n{log}"
    assert_no_spills(ptxas_report(log), f"{module} with the launch log")


def test_stamped_verification_compiles(tmp_path: Path):
    """speculative.cu's per-item stamps (bench/probe_verify.py) compile; the stamped build is a probe's
    only, so spills there (a few bytes at C = 8) are allowed."""
    rc, log = compile_cubin(CUDA_SRC / "speculative.cu", tmp_path, defines=("GLIMMER_INSTANTIATE", "GLIMMER_STAMPS"))
    assert rc == 0, f"speculative.cu does not compile with its stamps:\n{log}"
    assert len(ptxas_report(log)) >= 11


# The layer stack runs its whole loop body once a layer, and an SM holds little code: 16 KB stayed
# in one where 64 KB did not (bench/probe_cold_code.py). Its first build inlined everything into
# 250 KB and spent ~26 µs a layer fetching it (bench/results/NOTES.md, the thirty-eighth session).
STACK_CODE_BUDGET = 96 * 1024


def test_decode_stack_code_stays_small(tmp_path: Path):
    """SmolLM2's instance of decode_stack_kernel (bench/code_size.py counts the same bytes) stays
    within STACK_CODE_BUDGET, its three shared functions called, not inlined."""
    src = tmp_path / "stack_one.cu"
    src.write_text('#include "decode_stack.cu"\n'
                   "void* glimmer_name_expressions[] = {(void*)&decode_stack_kernel<gguf::Q4_1, 64, false, 3>};\n")
    rc, log = compile_cubin(src, tmp_path)
    assert rc == 0, f"decode_stack.cu does not compile:\n{log}"
    assert_no_spills(ptxas_report(log), "decode_stack")
    sizes = text_sizes((tmp_path / "stack_one.cubin").read_bytes())
    [kernel] = [n for n in sizes if n.startswith("_Z19decode_stack_kernel")]
    assert sizes[kernel] <= STACK_CODE_BUDGET, (
        f"decode_stack_kernel is {sizes[kernel]} bytes of machine code (budget {STACK_CODE_BUDGET})")
    calls = re.findall(r"Function properties for (_ZN6dstack\w+)", log)
    assert {"make_codes", "add_norm_codes", "mat_rows"} <= {re.sub(r"^_ZN6dstack\d+|I.*$|E.*$", "", c)
                                                            for c in calls}, calls

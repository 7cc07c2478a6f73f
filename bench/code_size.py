"""Machine-code bytes of every kernel in cuda_src/*.cu, from the cubins nvcc makes for sm_90 (no GPU).

An SM holds little code: straight-line code that is not in it runs at ~1.3-2.5 ns an instruction
from L2 and up to 5.4 from DRAM, against ~0.6 held, and 16 KB were held where 64 KB were not
(bench/probe_cold_code.py, bench/results/NOTES.md). A kernel that runs through more code than that
on every pass of a loop pays the fetch on every pass; this report shows which kernels are that big.

    python3 bench/code_size.py                     # every .cu, the largest kernels first
    python3 bench/code_size.py decode_stack -n 8   # one file's eight largest
"""

from __future__ import annotations

import argparse
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glimmer_cupy.kernels.build import ARCH_SPECIFIC  # noqa: E402

CUDA_SRC = ROOT / "cuda_src"
ARCH = "sm_90"                   # the H200's
INSTR_BYTES = 16                 # one sm_90 instruction


def arch_flags(src: Path) -> list[str]:
    """nvcc's target for a cuda_src file as the build layer compiles it: sm_90a, with denormals
    flushed as its NVRTC options ask, for the modules of architecture-specific instructions
    (kernels/build.py: ARCH_SPECIFIC), sm_90 for the others."""
    if src.stem in ARCH_SPECIFIC:
        return [f"-gencode=arch=compute_{ARCH[3:]}a,code={ARCH}a", "-ftz=true"]
    return [f"-arch={ARCH}"]


def text_sizes(cubin: bytes) -> dict[str, int]:
    """{function name: bytes of its .text section} of a 64-bit little-endian ELF (a cubin)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]

    def name(off: int) -> str:
        end = cubin.index(b"\0", names_at + off)
        return cubin[names_at + off:end].decode()

    return {name(s[0])[len(".text."):]: s[5] for s in sections if name(s[0]).startswith(".text.")}


def nvcc_command(src: Path, out: Path, defines=(), flags=(), nvcc: str = "nvcc", kind: str = "cubin") -> list[str]:
    """nvcc's command line for a cubin (or, kind "ptx", the PTX) of src as the build layer compiles
    it (arch_flags, C++17, cuda_src on the include path), with -D of each define and the extra flags."""
    return [nvcc, *arch_flags(src), "-std=c++17", f"-I{CUDA_SRC}", f"--{kind}", *flags,
            *(f"-D{d}" for d in defines), "-o", str(out), str(src)]


def nvdisasm_path() -> str | None:
    """nvdisasm on PATH, else the one pip installs with nvidia-cuda-nvdisasm (a dev dependency: the
    CUDA toolkit's nvcc packages may leave it out); None where neither is."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for path in sorted(Path(root).glob("*/bin/nvdisasm")):
            return str(path)
    return None


def compile_sizes(src: Path, defines=()) -> dict[str, int]:
    """text_sizes of src compiled with every template instance (GLIMMER_INSTANTIATE)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k.cubin"
        run = subprocess.run(nvcc_command(src, out, ("GLIMMER_INSTANTIATE", *defines)), capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"nvcc failed on {src.name}:\n{run.stderr}")
        return text_sizes(out.read_bytes())


def demangle(names: list[str]) -> list[str]:
    if not shutil.which("c++filt"):
        return names
    run = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return run.stdout.splitlines() if run.returncode == 0 else names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="cuda_src file stems (default: every .cu)")
    ap.add_argument("-n", type=int, default=40, help="kernels to list (largest first)")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="a define, as NAME=VALUE")
    args = ap.parse_args(argv)
    if not shutil.which("nvcc"):
        print("code_size: nvcc is not on PATH", file=sys.stderr)
        return 2
    srcs = [CUDA_SRC / f"{f}.cu" for f in args.files] or sorted(CUDA_SRC.glob("*.cu"))
    missing = [s.name for s in srcs if not s.exists()]
    if missing:
        print(f"code_size: no such source in cuda_src: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = []
    for src in srcs:
        for fn, size in compile_sizes(src, args.defines).items():
            rows.append((size, src.stem, fn))
    rows.sort(reverse=True)
    rows = rows[:args.n]
    print("| KB | instructions | file | kernel |\n|---|---|---|---|")
    for (size, stem, _), pretty in zip(rows, demangle([r[2] for r in rows])):
        print(f"| {size / 1024:.1f} | {size // INSTR_BYTES} | {stem} | `{pretty[:110]}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

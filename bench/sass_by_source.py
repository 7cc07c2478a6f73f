"""How a kernel's SASS divides among the source functions it inlines: compiles a cuda_src file for
sm_90 with line information (nvcc -lineinfo), disassembles it (nvdisasm, which pip installs as
nvidia-cuda-nvdisasm, found there when it is not on PATH, or give --nvdisasm), and counts the
instructions attributed to each source line (the innermost one in cuda_src: an intrinsic counts for
its caller), then to the function that line lies in. The sizes tell
which code a block that runs a stretch once has to fetch (bench/results/NOTES.md, twenty-fourth
session: the last block's merge).

    python3 bench/sass_by_source.py attention_stream 'attn_stream_kernelILi128ELi3' [--top 25]

--stamps: built with GLIMMER_STAMPS (cuda_src/stamps.cuh) as the stage probes build it, the
instructions between the kernel's stamps instead, in address order: how much code each stage between
two stamps runs through, the code a block runs once per launch when the stage has no loop (a stage's
share of a launch's cold-code cost, with bench/probe_cold_code.py's ns an instruction).

    python3 bench/sass_by_source.py attention_stream 'attn_stream_kernelILi128ELi3' --stamps
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from code_size import INSTR_BYTES, nvcc_command, nvdisasm_path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "cuda_src"
FUNC = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:__\w+__\s+)*(?:[\w:<>,*&]+\s+)+\**(\w+)\s*\(")


def functions(path: Path) -> list[tuple[int, str]]:
    """(first line, name) of each function defined at the start of a line in a source file (a name
    on the line after `__launch_bounds__(...)` for a kernel)."""
    out = []
    text = path.read_text().splitlines()
    for i, line in enumerate(text, 1):
        m = FUNC.match(line)
        if m and not line.lstrip().startswith(("return", "if", "for", "while", "#")):
            name = m.group(1)
            if name == "__launch_bounds__" and i < len(text):
                nxt = re.match(r"\s*(\w+)\s*\(", text[i])
                name = nxt.group(1) if nxt else name
            out.append((i, name))
    return out


def counts(sass: str, kernel: str) -> collections.Counter:
    """Instructions per (file name, line) in the .text section of the first function whose mangled
    name contains `kernel`."""
    lines = sass.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith(".text.") and kernel in l), None)
    if start is None:
        raise SystemExit(f"sass_by_source: no function matching {kernel!r}")
    c, cur, chain = collections.Counter(), ("?", 0), False
    for line in lines[start + 1:]:
        if line.startswith("//-----"):
            break
        if line.lstrip().startswith("//## File"):
            # nvdisasm -gi prints an instruction's inlining chain innermost first, a line a frame: the
            # innermost frame in cuda_src counts (an intrinsic's line for the function that called it)
            if not chain:
                frames = [(Path(f), int(n)) for f, n in re.findall(r'"([^"]+)", line (\d+)', line)]
                f, n = next(((f, n) for f, n in frames if f.parent == SRC), frames[0])
                cur = (f.name, n)
            chain = True
        elif re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            c[cur] += 1
            chain = False
    return c


INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b.*?(\.L_x_\d+)")
TIMER = re.compile(r"CS2R (R\d+), SR_GLOBALTIMER")
# a stamp's store of the timer read into R: STG.E.64 [Rb.64+0xOFF], R; OFF / 8 is its index in the row
STAMP_STORE = r"STG\.E\.64 \S*\[R\d+\.64(?:\+0x([0-9a-f]+))?\], {} ;"


def listing(sass: str, kernel: str) -> list[tuple[str | None, int | None, str]]:
    """The .text section of the first function whose mangled name contains `kernel`, in address
    order: (None, address, instruction) for an instruction (as listed, its predicate kept) and
    (label, None, "") where a branch target's label starts."""
    lines = sass.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith(".text.") and kernel in l), None)
    if start is None:
        raise SystemExit(f"sass_by_source: no function matching {kernel!r}")
    out = []
    for line in lines[start + 1:]:
        if line.startswith("//-----") or line.startswith(".text."):
            break
        m = INSTR.match(line)
        if m:
            out.append((None, int(m.group(1), 16), m.group(2)))
        elif LABEL.match(line):
            out.append((LABEL.match(line).group(1), None, ""))
    return out


def written(text: str) -> set[int]:
    """The general registers an instruction writes: its first operand where that is a register
    (the second for SHFL, whose first is a predicate), with the width its opcode gives (.64 / .WIDE
    two, .128 four, a warpgroup multiply's 64xN accumulators N / 2)."""
    m = re.match(r"(?:@!?U?P\w+\s+)?([A-Za-z0-9_.]+)\s+([^;]*)", text)
    if not m:
        return set()
    op, operands = m.group(1), [o.strip() for o in m.group(2).split(",")]
    first = operands[1] if op.startswith("SHFL") and len(operands) > 1 else operands[0]
    reg = re.fullmatch(r"R(\d+)(?:\.reuse)?", first)
    if not reg:
        return set()
    acc = re.match(r"HGMMA\.64x(\d+)", op)
    width = int(acc.group(1)) // 2 if acc else 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1
    return set(range(int(reg.group(1)), int(reg.group(1)) + width))


def loop_clobbers(sass: str, kernel: str, reader: str, width: int) -> list[str]:
    """Registers that instructions matching `reader` (a regex whose group 1 is the first of `width`
    consecutive registers read) read inside their innermost loop, and that the loop writes after a
    read without defining them again before it: values the compiler let die on the loop's back edge,
    so the next pass reads whatever was written over them. Each as "R<n> (read by ...; written by
    ...)". Raises ValueError where no loop holds the readers."""
    ins = listing(sass, kernel)
    labels = {label: i for i, (label, _, _) in enumerate(ins) if label}
    reads = [(i, int(m.group(1))) for i, (_, _, t) in enumerate(ins) for m in [re.search(reader, t)] if m]
    if not reads:
        raise ValueError(f"no instruction of {kernel} matches {reader!r}")
    first, last = reads[0][0], reads[-1][0]
    edges = [(labels[m.group(1)], i) for i, (_, _, t) in enumerate(ins) for m in [BRANCH.search(t)]
             if m and i > last and labels.get(m.group(1), first + 1) <= first]
    if not edges:
        raise ValueError(f"no loop of {kernel} holds the instructions matching {reader!r}")
    # the innermost: the first back edge after the readers (then the latest head). Not the latest head
    # first: ptxas places the retry loops of barrier waits out of line at the function's end, and their
    # edges back into the tile loop would take the whole function for the loop.
    head, back = min(edges, key=lambda e: (e[1], -e[0]))
    writes = [written(t) for _, _, t in ins]
    out = []
    for i, r0 in reads:
        for r in range(r0, r0 + width):
            if any(r in writes[j] for j in range(head, i)):
                continue
            by = next((ins[j][2] for j in range(first + 1, back + 1) if r in writes[j]), None)
            if by is not None:
                out.append(f"R{r} (read by {ins[i][2].rstrip(' ;')}; written by {by.rstrip(' ;')})")
    return out


# a warpgroup multiply from registers: group 1 the accumulators' N (64xN: N / 2 registers), group 2
# the first accumulator, group 3 the first of A's four registers
HGMMA_RS = re.compile(r"HGMMA\.64x(\d+)\S* R(\d+), R(\d+), gdesc")
# a wait until at most N groups of multiplies are pending (group 1: N); a multiply with gsb0 ends a group
WAIT = re.compile(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)")


def inflight_clobbers(sass: str, kernel: str) -> list[str]:
    """Registers of a warpgroup multiply with A from registers (A and its accumulators) that another
    instruction writes while the multiply may still be running: after it and before a wait that
    leaves fewer groups pending than were committed since its own (groups end at the multiplies
    marked gsb0), in address order (the fall-through path). ptxas treats register operands as read
    at issue, so it can give them to other values while the tensor cores still read them. Each as
    "R<n> (in <multiply>; written by <instruction>)"."""
    ins = listing(sass, kernel)
    out = []
    for i, (_, _, t) in enumerate(ins):
        m = HGMMA_RS.search(t)
        if not m:
            continue
        acc, a = int(m.group(2)), int(m.group(3))
        regs = set(range(a, a + 4)) | set(range(acc, acc + int(m.group(1)) // 2))
        committed = 1 if "gsb0" in t else 0       # groups committed from this multiply's own on
        for _, _, later in ins[i + 1:]:
            wait = WAIT.search(later)
            if wait and committed > int(wait.group(1), 16):
                break
            if later.startswith("HGMMA"):
                committed += "gsb0" in later
                continue
            hit = written(later) & regs
            if hit:
                out.append(f"R{min(hit)} (in {t.rstrip(' ;')}; written by {later.rstrip(' ;')})")
                break
    return out


def stamp_regions(sass: str, kernel: str) -> list[tuple[int | None, int, int]]:
    """(stamp index or None, address, instructions since the previous stamp or the function's
    start) for each read of the global timer in the first function whose name contains `kernel`,
    in address order, then (None, end, instructions after the last stamp)."""
    ins = [(addr, text) for _, addr, text in listing(sass, kernel) if addr is not None]
    out, prev = [], 0
    for i, (addr, text) in enumerate(ins):
        timer = TIMER.search(text)
        if not timer:
            continue
        pattern = re.compile(STAMP_STORE.format(timer.group(1)))
        store = next((m for m in (pattern.search(t) for _, t in ins[i + 1:i + 40]) if m), None)
        index = int(store.group(1) or "0", 16) // 8 if store else None
        out.append((index, addr, i - prev))
        prev = i
    if ins:
        out.append((None, ins[-1][0] + 16, len(ins) - prev))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a file of cuda_src without .cu, e.g. attention_stream")
    ap.add_argument("kernel", help="a part of the mangled kernel name, e.g. attn_stream_kernelILi128ELi3")
    ap.add_argument("--nvdisasm", default=nvdisasm_path() or "nvdisasm")
    ap.add_argument("--define", action="append", default=[], metavar="NAME[=V]")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--stamps", action="store_true", help="instructions between the stamps of a GLIMMER_STAMPS build")
    a = ap.parse_args(argv)
    if a.stamps:
        a.define.append("GLIMMER_STAMPS")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        subprocess.run(nvcc_command(SRC / f"{a.source}.cu", cubin, ("GLIMMER_INSTANTIATE", *a.define), ("-lineinfo",)),
                       check=True)
        sass = subprocess.run([a.nvdisasm, "-c", "-gi", str(cubin)], check=True, capture_output=True, text=True).stdout
    if a.stamps:
        print(f"{a.kernel} (GLIMMER_STAMPS): instructions from the stamp before, in address order")
        regions = stamp_regions(sass, a.kernel)
        for j, (index, addr, n) in enumerate(regions):
            name = "end" if j == len(regions) - 1 else f"stamp {'?' if index is None else index}"
            print(f"  {addr:#8x}  {name:9s} {n:6d} ({n * INSTR_BYTES / 1024:5.1f} KB)")
        return 0
    c = counts(sass, a.kernel)
    total = sum(c.values())
    by_func = collections.Counter()
    spans = {}
    for (name, line), n in c.items():
        path = SRC / name
        if path.exists():
            spans.setdefault(name, functions(path))
            owner = [f for first, f in spans[name] if first <= line]
            by_func[f"{name}: {owner[-1] if owner else '?'}"] += n
        else:
            by_func[name] += n                 # CUDA's own headers (intrinsics)
    print(f"{a.kernel}: {total} instructions, {total * 16 / 1024:.1f} KB")
    for key, n in by_func.most_common(a.top):
        print(f"  {n:7d} {n * 16 / 1024:7.1f} KB  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

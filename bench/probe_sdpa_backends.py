"""PyTorch's SDPA at decode shapes (Qwen3-8B heads: 32 query, 8 KV, head_dim 128, one query a
sequence, bf16), pure torch: which kernels the default dispatch runs, and each backend forced alone
against float64 attention (NMSE, the fraction of exact zeros, NMSE against the default's output).
A check on bench_attention.py's SDPA baseline that shares no memory or stream with CuPy.

    python3 bench/probe_sdpa_backends.py [--cases 1:8192,8:8192,1:32768,8:32768]
"""

from __future__ import annotations

import argparse


def nmse(a, b) -> float:
    a, b = a.double(), b.double()
    return float(((a - b) ** 2).mean() / (b ** 2).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1:8192,8:8192,1:32768,8:32768", help="BATCH:CONTEXT,...")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    for case in args.cases.split(","):
        b, ctx = (int(v) for v in case.split(":"))
        q = torch.randn(b, 32, 1, 128, device="cuda").bfloat16()
        k = torch.randn(b, 8, ctx, 128, device="cuda").bfloat16()
        v = torch.randn(b, 8, ctx, 128, device="cuda").bfloat16()
        scale = 128 ** -0.5
        kk, vv = k.double().repeat_interleave(4, 1), v.double().repeat_interleave(4, 1)
        exact = torch.softmax(q.double() @ kk.transpose(-1, -2) * scale, -1) @ vv
        del kk, vv
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            default = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
            torch.cuda.synchronize()
        names = sorted({e.name[:70] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        line = f"B={b} L={ctx} default {nmse(default, exact):.1e} kernels {names}"
        for bk in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                   SDPBackend.MATH):
            try:
                with sdpa_kernel([bk]):
                    out = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
                    torch.cuda.synchronize()
                line += (f" | {bk.name} {nmse(out, exact):.1e} zero {float((out == 0).float().mean()):.2f}"
                         f" vs default {nmse(out, default):.1e}")
            except RuntimeError as e:
                line += f" | {bk.name} n/a ({str(e)[:60]})"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

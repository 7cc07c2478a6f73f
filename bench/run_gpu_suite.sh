#!/usr/bin/env bash
# Run every GPU test and benchmark of the project on this machine, results under OUTDIR.
#   bash bench/run_gpu_suite.sh OUTDIR [--quick]
# Each step has its own time limit, so one slow or failing step does not hide the others.
set -u
out=${1:?usage: run_gpu_suite.sh OUTDIR [--quick]}
quick=${2:-}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GLIMMER_COMMIT=${GLIMMER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "== $name"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "   exit $? ($(tail -n 1 "$out/$name.log" | cut -c1-160))"
}

step tests 600 python3 bench/run_gpu_tests.py --out "$out/tests" --limit 580     # 8 pytest processes at once
if [ "$quick" = "--quick" ]; then
    step decode 300 python3 -m glimmer_cupy.cli bench decode --synthetic qwen3-0.6b --runs 3 --out "$out/decode"
    step quant_matmul 300 python3 bench/bench_quant_matmul.py --types Q4_K,Q6_K --ms 1,16,17,512 --out "$out/quant_matmul"
    step attention 300 python3 bench/bench_attention.py --batches 1,8 --contexts 1024,32768 --out "$out/attention"
    step sampling 300 python3 bench/bench_sampling.py --quick --out "$out/sampling.json"
    step chain 120 python3 bench/bench_chain.py --out "$out/chain.json"
else
    step decode 600 python3 -m glimmer_cupy.cli bench decode --synthetic qwen3-0.6b --synthetic qwen3-4b \
        --synthetic qwen3-8b --out "$out/decode_synthetic"
    step quant_matmul 600 python3 bench/bench_quant_matmul.py --out "$out/quant_matmul"
    step elementwise 300 python3 bench/bench_elementwise.py --json "$out/elementwise.json"
    step attention 600 python3 bench/bench_attention.py --out "$out/attention"
    step sampling 600 python3 bench/bench_sampling.py --out "$out/sampling.json"
    step chain 120 python3 bench/bench_chain.py --splits 1,4,16 --out "$out/chain.json"
fi

#!/usr/bin/env bash
# The GPU checks and GPU benchmarks in one go (at most 9.5 minutes; each step has its own limit), from the repository root:
#
#   bash benchmarks/gpu_session.sh OUT_DIR
#
# 1. the CUDA tests (FedAvg on the GPU against the plain-PyTorch oracle with every client
#    executor, same seed => same weights, every shipped config for 2 rounds on the GPU, the
#    codecs' and batches' device tests);
# 2. benchmarks/overhead.py --ragged 10,50 on the GPU (issue 16, item 5);
# 3. benchmarks/pfl_cifar10.py on the GPU, every executor (pfl-research's CIFAR-10 set-up);
# 4. benchmarks/memory.py on the GPU: the batched executor's peak memory with and without
#    max_batched_clients, beside the lean executor's.
# Reports land in OUT_DIR (7 files); each step has its own time limit, so one failure leaves the rest.
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_session.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 WANDB_MODE=offline
log="$out/bench.log"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, lightning; print("torch", torch.__version__, "CUDA", torch.version.cuda, "lightning", lightning.__version__)'
} 2>&1 | tee "$log"

step() {  # step NAME SECONDS COMMAND...: runs COMMAND under a time limit, stderr to the log
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" >>"$log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$log"
}

step tests 180 python3 -m pytest -q -p no:cacheprovider -n 8 -rs --junit-xml="$out/tests.xml" \
  tests/integration/test_cuda.py tests/compression/test_rotation_codecs.py tests/compression/test_masked_noise.py \
  tests/test_benchmark_reporting.py tests/data/test_batches.py
step overhead 120 python3 benchmarks/overhead.py --ragged 10,50 --device cuda --repeats 2 --out "$out/overhead_cuda.md"
step pfl 140 python3 benchmarks/pfl_cifar10.py --device cuda --executors lightning,lean,batched --repeats 2 --out "$out/pfl_cuda.md"
memory=(python3 benchmarks/memory.py --device cuda --algorithms fedavg --clients 1000 --samples 20000 --per-round 50 --rounds 3)
step memory-lean 40 "${memory[@]}" --executor lean --out "$out/memory_lean.md"
step memory-batched-10 40 "${memory[@]}" --executor batched --max-batched-clients 10 --out "$out/memory_batched10.md"
step memory-batched 40 "${memory[@]}" --executor batched --out "$out/memory_batched.md"

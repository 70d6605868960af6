#!/usr/bin/env bash
# The GPU measurements of issue 30 (the batched executor at the hardware's pace) in one go, within 8 minutes
# (each step has its own time limit, so one failure leaves the rest), from the repository root:
#
#   bash benchmarks/gpu_session.sh OUT_DIR        # writes OUT_DIR/report.md (and OUT_DIR/bench.log)
#
# NOT RUN YET: it was written in a session without a GPU; its figures are pending a GPU session
# (benchmarks/RESULTS.md says so). What it measures:
# 1. the CUDA tests (FedAvg on the GPU against the plain-PyTorch oracle with every client executor),
#    the executor feature table and the compiled steps (inductor) on the CPU, for the record;
# 2. benchmarks/pfl_cifar10.py, pfl-research's CIFAR-10 set-up, at 50 clients per round: the plain loop,
#    the lean and batched executors, batched with compiled steps, and the hand-written torch.func loop eager
#    and compiled (goals: batched >= 1,500 clients/s, within 1.3x of the hand loop); first round (compile
#    time) and peak GPU memory per row;
# 3. the same at 200 clients per round, batched with the default group size and capped at 50 (goal: >= 1,000
#    clients/s, never fewer than at 50);
# 4. benchmarks/overhead.py --ragged 10,50 on the GPU: ragged clients, batched eager and compiled vs the plain loop.
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_session.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 WANDB_MODE=offline
log="$out/bench.log"
report="$out/report.md"
{
  echo "# GPU session, issue 30 ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, lightning; print("torch", torch.__version__, "CUDA", torch.version.cuda, "lightning", lightning.__version__)'
  echo '```'
} >"$report" 2>&1

step() {  # step NAME SECONDS COMMAND...: runs COMMAND under a time limit, its output to the log
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" >>"$log" 2>&1
  echo "- $name: exit $? after $((SECONDS - start)) s" | tee -a "$log" >>"$report"
}

step tests 100 python3 -m pytest -q -p no:cacheprovider -n 8 -rs tests/integration/test_cuda.py \
  tests/loops/test_executor_features.py tests/loops/test_batched_compile.py
pfl=(python3 benchmarks/pfl_cifar10.py --device cuda --hand-vmap eager,compiled --repeats 2)
step pfl-50 150 "${pfl[@]}" --per-round 50 --executors lean,batched,batched-compiled --out "$out/pfl50.md"
step pfl-200 150 "${pfl[@]}" --per-round 200 --warmup 1 --rounds 5 --executors batched,batched:50,batched-compiled \
  --out "$out/pfl200.md"
step ragged 70 python3 benchmarks/overhead.py --ragged 10,50 --device cuda --repeats 2 --ragged-executors batched,compiled \
  --out "$out/ragged.md"
for part in pfl50 pfl200 ragged; do
  [ -f "$out/$part.md" ] && { echo; cat "$out/$part.md"; } >>"$report"
done
echo "report: $report"

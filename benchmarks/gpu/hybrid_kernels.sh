#!/usr/bin/env bash
# Issue 45's GPU run in one device call of at most 9.5 minutes on one H100/H200: Nemotron-H-like, Granite-4.0-H-like
# and LFM2-like models on flash-linear-attention's varlen kernels, sft / flan_like / orcamath_like, packed against
# the oracles and padding, and exact against each example alone. From the repository root.
#
# fla is staged by shared/gpu/fla-wheels.sh (run `bash ../shared/gpu/fla-wheels.sh` here first: `.fla2`, and tilelang
# in `.fla1`), and mamba-ssm built without its CUDA extensions (its SSD scan is Triton) in `.mamba`:
#   mkdir -p .mamba && MAMBA_SKIP_CUDA_BUILD=TRUE pip wheel --no-deps --no-build-isolation -w .mamba mamba-ssm==2.3.2.post1
# Mamba2 and the short convolutions need no tilelang (it stands in for fla's Gated DeltaNet backward on Hopper with
# Triton < 3.7.1), so one device call, carry [".fla2", ".mamba"]:  bash benchmarks/gpu/hybrid_kernels.sh
# (with tilelang: first a call with carry [".fla1"]: mkdir -p /tmp/fla && cp .fla1/* /tmp/fla/).
# Results: $OUT/hybrid_kernels/results.json (one entry per model) and logs/, to commit as
# benchmarks/results/hybrid_kernels_<card>/.
#
# What is cut to fit: each model keeps the first layers of its pattern (Nemotron-H 12 of 24 blocks: 5 Mamba2, 1
# attention, 6 MLP; Granite 10 of 20: 9 Mamba2, 1 attention; LFM2 8 of 16: 6 convs, 2 attention; the widths are
# the full models'), 3 rounds of 4 timed steps after 2 warm-up steps per mode (padded modes: 2 timed steps), and no
# per_example mode. Nemotron-H runs first and gets the longest limits: it pays Triton's and tilelang's first
# compiles of fla's conv and simple-GLA kernels (Granite's Mamba2 has the same head sizes: it should reuse them from
# Triton's cache). Every step gets a time limit from what is left before the deadline, so a slow step costs its
# own figures only; each process writes what it finished.
set -uo pipefail
START=$(date +%s)
DEADLINE=$((START + ${HYBRID_SECONDS:-555}))  # 9 min 15 s after the start: the call's 9.5 min minus a margin
OUT_DIR=${OUT:-/tmp/out}/hybrid_kernels
mkdir -p "$OUT_DIR/logs"

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/flasite .fla2/*.whl \
  $(ls /tmp/fla/*.whl .mamba/*.whl 2>/dev/null) > "$OUT_DIR/logs/install.log" 2>&1
export PYTHONPATH=/tmp/flasite:$PWD${PYTHONPATH:+:$PYTHONPATH}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers, fla; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, 'fla', fla.__version__)"
  python3 -c "import tilelang; print('tilelang', tilelang.__version__)"
  python3 -c "from packing_collators.models._ssd import mamba_ssm_ssd; print('SSD scan:', mamba_ssm_ssd()[1])"
  git log -1 --format='commit %H' 2>/dev/null || true; } 2>&1 | tee "$OUT_DIR/logs/versions.log"

# run <cap seconds> <log name> <hybrid_throughput.py arguments...>: at most <cap>, and never past the deadline
run() {
  local cap=$1 name=$2 left
  shift 2
  left=$((DEADLINE - $(date +%s)))
  if (( left < 20 )); then echo "skipped $name: ${left}s left" | tee -a "$OUT_DIR/logs/skipped.log"; return; fi
  (( cap > left )) && cap=$left
  echo "$(date +%T) $name (limit ${cap}s)"
  timeout "$cap" python3 benchmarks/gpu/hybrid_throughput.py "$@" --out "$OUT_DIR" > "$OUT_DIR/logs/$name.log" 2>&1
  local rc=$?
  echo "$(date +%T) $name exit $rc$( ((rc == 124)) && echo ' (time limit)')"
}

# mamba-ssm autotunes each of its Triton kernels over up to ~100 configurations at first use (minutes): the results
# are cached on disk for the later processes of the call (Triton >= 3.4).
export TRITON_CACHE_AUTOTUNING=1
TIMING="--skip-exactness --tokens-per-step 16384 --steps 4 --padded-steps 2 --warmup 2 --rounds 3"
TIMING+=" --modes packed,oracle,oracle_work,padded,padded_kernels"
declare -A LAYERS=([nemotron_h]=12 [granitemoehybrid]=10 [lfm2]=8)
# transformers' Mamba2 torch reference (the padded mode) holds rows x width x chunk x heads x state floats at once:
# its padded batches of 8 run as calls of 2 of their rows (the same width, padding and work); LFM2's run whole.
declare -A PADDED_ROWS=([nemotron_h]=2 [granitemoehybrid]=2 [lfm2]=8)
declare -A CAPS=([nemotron_h]="170 70" [granitemoehybrid]="140 45" [lfm2]="90 40")
for entry in ${HYBRID_CAPS:-}; do  # HYBRID_CAPS="nemotron_h:330:150 lfm2:0:60": a model's limits (0: skip that part)
  IFS=: read -r model throughput exactness <<< "$entry"
  CAPS[$model]="$throughput $exactness"
done
for model in ${HYBRID_MODELS:-nemotron_h granitemoehybrid lfm2}; do  # HYBRID_MODELS: which, in which order
  read -r throughput exactness <<< "${CAPS[$model]}"
  (( throughput > 0 )) && run "$throughput" "${model}_throughput" --model "$model" --layers "${LAYERS[$model]}" $TIMING \
    --padded-rows-per-call "${PADDED_ROWS[$model]}"
  (( exactness > 0 )) && run "$exactness" "${model}_exactness" --model "$model" --layers "${LAYERS[$model]}" --skip-throughput
done
echo "done in $(( $(date +%s) - START ))s"

#!/usr/bin/env bash
# Issue #64's hybrid GRPO rows on one fresh GPU machine, in device calls of at most 600 s.
#
# Why phases: on a fresh machine fla's and tilelang's kernels compile at every new sequence length (~20 s each),
# TRL's padded shapes most of all; a process whose limit runs out inside those compiles leaves no timed step. The
# `cold` phase runs every setting's exact groups (the same seed, steps and prompts as the rows) at once, in parallel
# processes on the one GPU, so the compiles land in the on-disk caches (Triton's, tilelang's) side by side; its
# timings are not used. `warm` then times each setting alone, one process after another, as grpo_update.py --all
# does, the ~1k row with one group's generation (the whole step). `extra` runs RLOO's row on the warm caches.
#
#   PHASE=cold|warm|extra bash benchmarks/gpu/grpo_hybrid_session.sh RESULTS_DIR
#
# Needs PYTHONPATH with TRL and fla (benchmarks/results/grpo_hybrid_h100/README.md says how they are carried).
set -u
out=${1:?results dir}
phase=${PHASE:?PHASE=cold, warm or extra}
G="python3 benchmarks/gpu/grpo_update.py --model qwen3_5"
one_k="--steps 6 --warmup 2"
gen="--generate 1 --generate-tokens 256"  # the whole step: one group's generation, TRL's own code on every side
two_k="--steps 4 --warmup 2 --prompts 2048,2800,4096"
mkdir -p "$out"
case "$phase" in
  cold)
    $G --all $one_k $gen --settings trl --setting-timeout 520 --out "$out/cold_trl_1k" > "$out/cold_trl_1k.log" 2>&1 &
    $G --all $two_k --settings trl --setting-timeout 520 --out "$out/cold_trl_2k" > "$out/cold_trl_2k.log" 2>&1 &
    $G --all $one_k $gen --settings packed,shared --setting-timeout 260 --out "$out/cold_ours_1k" > "$out/cold_ours_1k.log" 2>&1 &
    $G --all $two_k --settings packed,shared --setting-timeout 260 --out "$out/cold_ours_2k" > "$out/cold_ours_2k.log" 2>&1 &
    wait ;;
  warm)  # both rows in one call: six processes, each capped (WARM_TIMEOUT, default 90 s) so the call fits 600 s
    cap=${WARM_TIMEOUT:-90}
    $G --all $one_k $gen --settings trl,packed,shared --setting-timeout "$cap" --out "$out/warm_1k" > "$out/warm_1k.log" 2>&1
    $G --compare --out "$out/warm_1k" >> "$out/warm_1k.log" 2>&1
    $G --all $two_k --settings trl,packed,shared --setting-timeout "$cap" --out "$out/warm_2k" > "$out/warm_2k.log" 2>&1
    $G --compare --out "$out/warm_2k" >> "$out/warm_2k.log" 2>&1 ;;
  extra)
    $G --all $one_k --trainer rloo --settings trl,packed,shared --setting-timeout 150 --out "$out/rloo_1k" > "$out/rloo_1k.log" 2>&1
    $G --compare --out "$out/rloo_1k" >> "$out/rloo_1k.log" 2>&1 ;;
  *) echo "unknown PHASE $phase" >&2; exit 2 ;;
esac

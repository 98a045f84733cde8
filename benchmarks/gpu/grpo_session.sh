#!/usr/bin/env bash
# Issue #64's GRPO rows (the hybrid by default) on one fresh GPU machine, in device calls of at most 600 s.
#
# Why phases: on a fresh machine fla's and tilelang's kernels compile at every new sequence length (~20 s each),
# TRL's padded shapes most of all; a process whose limit runs out inside those compiles leaves no timed step. The
# `cold` phase runs every setting's exact groups (the same seed, steps and prompts as the rows) at once, in parallel
# processes on the one GPU, so the compiles land in the on-disk caches (Triton's, tilelang's) side by side; its
# timings are not used. `warm` then times each setting alone, one process after another, as grpo_update.py --all
# does, the ~1k row with one group's generation (the whole step). `extra` runs RLOO's row on the warm caches.
#
#   PHASE=cold|warm|extra|profile|exactness [LENGTHS="1k 2k"] bash benchmarks/gpu/grpo_session.sh RESULTS_DIR
#
# `profile` times and profiles one group per length instead (benchmarks/results/grpo_hybrid_profile_h100).
#
# MODEL=qwen3 (the dense 1.7B shape) runs the same rows; it compiles nothing per length (no fla), so
# PHASE="warm extra" alone does. PHASE may name several phases, run in that order.
#
# EXTRA goes to every grpo_update.py call: FA4 on both sides is EXTRA="--attn packing_fa4 --trl-attn flash_attention_4"
# (FA4 installed as ../shared/GPU.md says; a RESULTS_DIR of its own, the run names do not say the attention).
#
# Needs PYTHONPATH with TRL and fla (benchmarks/results/grpo_hybrid_h100/README.md says how they are carried).
set -u
out=${1:?results dir}
phases=${PHASE:?PHASE=cold, warm or extra, or several in order}
G="python3 benchmarks/gpu/grpo_update.py --model ${MODEL:-qwen3_5} ${EXTRA:-}"  # EXTRA: e.g. FA4 on both sides
one_k="--steps 6 --warmup 2"
gen="--generate 1 --generate-tokens 256"  # the whole step: one group's generation, TRL's own code on every side
two_k="--steps 4 --warmup 2 --prompts 2048,2800,4096"
mkdir -p "$out"
declare -A rows=([1k]="$one_k $gen" [2k]="$two_k")  # the ~1k row also times one group's generation
lengths=${LENGTHS:-1k 2k}
for phase in $phases; do
case "$phase" in
  cold)  # TRL_COLD / OURS_COLD: each process's cap (OURS_COLD for packed and again for shared, one after the other)
    for n in $lengths; do
      $G --all ${rows[$n]} --settings trl --setting-timeout "${TRL_COLD:-520}" --out "$out/cold_trl_$n" > "$out/cold_trl_$n.log" 2>&1 &
      $G --all ${rows[$n]} --settings packed,shared --setting-timeout "${OURS_COLD:-260}" --out "$out/cold_ours_$n" > "$out/cold_ours_$n.log" 2>&1 &
    done
    wait ;;
  warm)  # three processes a length, each capped (WARM_TIMEOUT, default 90 s) so both lengths fit a 600 s call
    for n in $lengths; do
      $G --all ${rows[$n]} --settings trl,packed,shared --setting-timeout "${WARM_TIMEOUT:-90}" --out "$out/warm_$n" > "$out/warm_$n.log" 2>&1
      $G --compare --out "$out/warm_$n" >> "$out/warm_$n.log" 2>&1
    done ;;
  profile)  # one group at every step (--same-group), so fla's kernels compile once: step 2 profiled (torch.profiler
            # tables, the kernels' time and launches), step 3 timed; SETTINGS (default shared,packed,trl), each alone.
            # On a fresh machine the first call's processes spend ~100 s each compiling: run the phase twice.
    declare -A draw=([1k]="" [2k]="--prompts 2048,2800,4096")
    for n in $lengths; do
      $G --all ${draw[$n]} --same-group --steps 2 --warmup 2 --profile-step 2 --settings "${SETTINGS:-shared,packed,trl}" \
        --setting-timeout "${PROFILE_TIMEOUT:-150}" --out "$out/profile_$n" > "$out/profile_$n.log" 2>&1
      $G --compare --out "$out/profile_$n" >> "$out/profile_$n.log" 2>&1
    done ;;
  exactness)  # every hybrid family's shared and packed log-probabilities and gradients against TRL's padded forward
              # (float32 and bf16; shared_prefix_exactness.py), on the kernels installed; EXACTNESS_ARGS: e.g. --smoke
    python3 benchmarks/gpu/shared_prefix_exactness.py ${EXACTNESS_ARGS:-} --out "$out/exactness" > "$out/exactness.log" 2>&1 ;;
  extra)
    $G --all $one_k --trainer rloo --settings trl,packed,shared --setting-timeout "${RLOO_TIMEOUT:-150}" --out "$out/rloo_1k" > "$out/rloo_1k.log" 2>&1
    $G --compare --out "$out/rloo_1k" >> "$out/rloo_1k.log" 2>&1 ;;
  *) echo "unknown PHASE $phase" >&2; exit 2 ;;
esac
done

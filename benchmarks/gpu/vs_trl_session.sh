#!/usr/bin/env bash
# Issue #65's like-for-like rows against TRL's SFTTrainer, a device call at a time (each at most 600 s).
#
#   MODE=eager|compiled|defaults ROWS="152k:on 248k:on" [PAIRS="packing flattening"] [FUSED="--fused-norms ..."]
#       [TIMEOUT=150] bash benchmarks/gpu/vs_trl_session.sh RESULTS_DIR
#
# Each ROWS entry is <vocabulary>:<gradient checkpointing> (32k, 152k, 248k; on, off); each PAIRS entry one pair of
# settings, each its own process, ours then TRL's: packing = ours_packing / trl_bfd, flattening = ours_flattening /
# trl_padding_free. MODE picks vs_trl.py's --torch-compile (eager: off, both sides eager; compiled: on, both sides
# compiled; defaults: each side as its user gets it). FUSED adds our eager layers' fused kernels (vs_trl.py's
# --fused-norms --fused-mlp --fused-rope; for MODE=eager: inside torch.compile the MLP's and the rotary's run the
# model's own functions, and Inductor fuses the norm either way; before e9e4d14 they made the compiled model compile
# whole, on the full logits). EXTRA goes to every vs_trl.py call (--smoke here). Without FA4 or TRL importable it
# stops at once, before any setting runs.
# Every JSON records first_step_s (process start to the end of step 1) for both sides; --compare then writes
# results.json and README.md over every JSON in RESULTS_DIR, so several calls may fill one folder.
#
# Needs FA4 (`source .fa4b/install.sh`, ../shared/gpu/fa4-wheels.sh) and TRL on PYTHONPATH (vs_trl.py's header).
# A pair of 16 timed steps takes ~2 x 60-150 s on an H100: plan about three pairs a call.
set -u
out=${1:?results dir}
mode=${MODE:?MODE=eager, compiled or defaults}
rows=${ROWS:?ROWS, e.g. "152k:on 248k:off"}
declare -A vocab=([32k]=32000 [152k]=151936 [248k]=248320)
declare -A pair=([packing]=ours_packing,trl_bfd [flattening]=ours_flattening,trl_padding_free)
declare -A compile=([eager]=off [compiled]=on [defaults]=defaults)
[ -n "${compile[$mode]:-}" ] || { echo "unknown MODE $mode" >&2; exit 2; }
case " ${EXTRA:-} " in
  *" --smoke "*) ;;  # the CPU check: sdpa, no FA4
  *) python3 -c "import flash_attn.cute, trl" || { echo "FA4 or TRL is not importable: see the header" >&2; exit 2; } ;;
esac
mkdir -p "$out"
for row in $rows; do
  v=${row%%:*} gc=${row##*:}
  [ -n "${vocab[$v]:-}" ] || { echo "unknown vocabulary $v (32k, 152k, 248k)" >&2; exit 2; }
  for p in ${PAIRS:-packing flattening}; do
    [ -n "${pair[$p]:-}" ] || { echo "unknown pair $p (packing, flattening)" >&2; exit 2; }
    # shellcheck disable=SC2086  # FUSED is a list of options
    python3 benchmarks/gpu/vs_trl.py --all --settings "${pair[$p]}" --vocab "${vocab[$v]}" --grad-checkpointing "$gc" \
      --torch-compile "${compile[$mode]}" --steps 16 --warmup 3 --batch-size 55 --timeout "${TIMEOUT:-150}" \
      ${FUSED:-} ${EXTRA:-} --out "$out" > "$out/${p}_${mode}_${v}_gc_${gc}.log" 2>&1
  done
done
python3 benchmarks/gpu/vs_trl.py --compare --out "$out" > "$out/compare.log" 2>&1
tail -n 40 "$out/compare.log"

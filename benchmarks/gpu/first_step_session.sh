#!/usr/bin/env bash
# Issue #65's first step (process start to the end of step 1), on cold caches as on a fresh machine, or on caches kept
# from an earlier run on the same machine.
#
#   RUNS="new:ours_packing old:ours_packing trl:trl_bfd" [OLD_TREE=dir OLD_COMMIT=hash] [CACHES_DIR=dir] [VOCAB=151936] [GC=on] [COMPILE=off]
#       [FUSED="--fused-norms --fused-mlp --fused-rope"] [STEPS=4] [TIMEOUT=150] bash benchmarks/gpu/first_step_session.sh DIR
#
# Each RUNS entry is <tree>:<vs_trl.py setting>[:<caches>], run in its own process, one after another, into
# DIR/<n>_<tree>/:
# tree "new" (or "trl") imports this checkout's packing_collators, "old" the one under OLD_TREE (another commit's
# package, `git archive <commit> packing_collators | tar -x -C OLD_TREE`), so a change to what runs before step 1 is
# timed against the code before it on one machine, in one call. An entry without <caches> gets empty Triton, Inductor
# and FA4 caches of its own (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, FLASH_ATTENTION_CUTE_DSL_CACHE_DIR): it
# compiles what it needs, as the first run on a fresh machine does. Entries that name the same <caches> share one set,
# kept through the call (or under CACHES_DIR, kept after it for a later call): the first compiles, the later ones are a
# user's later runs on the same machine.
# A TRL process runs with FA4's disk cache off (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0, FA4's own default, which
# transformers and TRL leave alone; vs_trl.py imports this library, which would turn it on): TRL as its users run it
# compiles FA4's kernels in every process. TRL_FA4_DISK_CACHE=1 turns it on for TRL too.
# Each JSON keeps first_step_s, first_step_phases_s, startup_parts_s (PackingTrainer's parts before step 1) and
# triton_variants (the kernels each built). Needs FA4 and TRL on PYTHONPATH (vs_trl.py's header).
set -u
out=${1:?results dir}
runs=${RUNS:?RUNS, e.g. "new:ours_packing trl:trl_bfd"}
mkdir -p "$out"
n=0
kept=${CACHES_DIR:-$(mktemp -d)}  # the named cache sets
mkdir -p "$kept"
for run in $runs; do
  IFS=: read -r tree setting cache_set <<< "$run"
  n=$((n + 1))
  path=$PYTHONPATH commit=${PACKING_COLLATORS_COMMIT:-}
  if [ "$tree" = old ]; then
    [ -d "${OLD_TREE:-}/packing_collators" ] || { echo "OLD_TREE must hold another commit's packing_collators" >&2; exit 2; }
    path=$OLD_TREE:$PYTHONPATH commit=${OLD_COMMIT:-old}  # the JSON's commit: OLD_TREE's
  fi
  caches=$(mktemp -d) fa4_disk=1
  [ -n "$cache_set" ] && caches=$kept/$cache_set
  [ "$tree" = trl ] && fa4_disk=${TRL_FA4_DISK_CACHE:-0}
  # shellcheck disable=SC2086  # FUSED is a list of options
  PYTHONPATH=$path PACKING_COLLATORS_COMMIT=$commit TRITON_CACHE_DIR=$caches/triton TORCHINDUCTOR_CACHE_DIR=$caches/inductor \
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$caches/fa4 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=$fa4_disk timeout "${TIMEOUT:-150}" \
    python3 benchmarks/gpu/vs_trl.py --setting "$setting" --vocab "${VOCAB:-151936}" --grad-checkpointing "${GC:-on}" \
    --torch-compile "${COMPILE:-off}" --steps "${STEPS:-4}" --warmup 1 --batch-size 55 ${FUSED:-} ${EXTRA:-} \
    --out "$out/${n}_${tree}" > "$out/${n}_${tree}_${setting}.log" 2>&1
  echo "$n $tree $setting ${cache_set:-fresh caches} (FA4 disk cache $fa4_disk): rc $?"
  [ -z "$cache_set" ] && rm -rf "$caches"
done
[ -z "${CACHES_DIR:-}" ] && rm -rf "$kept"
python3 - "$out" <<'EOF'
import json, sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("*/*.json")):
    run = json.loads(path.read_text())
    parts = {k: round(v, 2) for k, v in (run.get("startup_parts_s") or {}).items()}
    phases = {k: round(v, 2) for k, v in run["first_step_phases_s"].items() if v is not None}
    print(path.parent.name, run["setting"], "first_step_s", round(run["first_step_s"], 2), phases, parts,
          run.get("triton_variants"))
EOF

#!/usr/bin/env bash
# Create (or reuse) a virtualenv holding the OLDEST versions pyproject.toml claims for torch,
# transformers, datasets and accelerate (each `name>=X` floor installed as `name==X`), plus the
# dev extra, so `make test-oldest` tests the floors rather than trusting them.
# Usage: scripts/install_oldest.sh [VENV_DIR]        (default .venv-oldest)
# torch: the CPU build from the PyTorch CPU index where it is reachable, else PyPI's wheel.
set -euo pipefail
venv="${1:-.venv-oldest}"
python="${PYTHON:-python3}"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip

# The floors, read from pyproject.toml's dependencies: "torch>=2.4,<3" -> torch==2.4
pins="$venv/oldest-constraints.txt"
"$python" - "$pins" <<'PY'
import re, sys
text = open("pyproject.toml").read()
deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
pins = []
for name in ("torch", "transformers", "datasets", "accelerate"):
    floor = re.search(rf'"{name}>=([0-9][0-9.]*)', deps)
    assert floor, f"pyproject.toml claims no floor for {name}"
    pins.append(f"{name}=={floor.group(1)}")
open(sys.argv[1], "w").write("\n".join(pins) + "\n")
print("oldest claimed:", " ".join(pins))
PY
torch_pin=$(grep '^torch==' "$pins")
# PyPI's Linux torch is a CUDA build: about 3 GB to download and 6 GB installed. Where the disk has less room
# than that, the floor cannot be installed here: the CPU build that pip finds on this machine's disk stands in,
# the pin follows it, and the run says so (make test-oldest prints it last) rather than failing on a full disk.
need_gib="${OLDEST_TORCH_NEED_GIB:-10}"
free_gib=$(df -Pk "$venv" | awk 'NR==2 {print int($4 / 1048576)}')
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  if "${pip[@]}" install -q --retries 0 --timeout 15 "$torch_pin" --index-url https://download.pytorch.org/whl/cpu; then
    :
  elif [ "$free_gib" -ge "$need_gib" ]; then
    echo "(the PyTorch CPU index did not answer: $torch_pin from PyPI, a CUDA build)"
    "${pip[@]}" install -q --no-cache-dir "$torch_pin"
  else
    stand_in="${OLDEST_TORCH_STAND_IN:-torch==2.13.0}"
    echo "NOT THE FLOOR: $torch_pin is not on the PyTorch CPU index here, and PyPI's CUDA build needs ~${need_gib} GiB" \
      "where ${free_gib} GiB are free: $stand_in stands in; transformers, datasets and accelerate are still their floors" |
      tee "$venv/torch-floor-not-tested"
    "${pip[@]}" install -q "$stand_in"
    sed -i "s/^torch==.*/$stand_in/" "$pins"
  fi
fi
# The dev extra (pytest, matplotlib, trl: pip picks the newest trl these floors allow, 0.29.1 here)
"${pip[@]}" install -q -e ".[dev]" -c "$pins"
"$venv/bin/python" - <<'PY'
import accelerate, datasets, torch, transformers
print("oldest venv:", "torch", torch.__version__, "transformers", transformers.__version__,
      "datasets", datasets.__version__, "accelerate", accelerate.__version__)
PY
touch "$venv/.installed-oldest"

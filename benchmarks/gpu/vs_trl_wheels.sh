#!/usr/bin/env bash
# Stage TRL's side of benchmarks/gpu/vs_trl.py for the GPU machine: the wheels of trl and datasets and of what they
# need that the device image lacks, into the git-ignored .trlwhl/ (about 1 MB; one device call carries 64 MiB).
# Run from the repository root. The image (Python 3.12, torch 2.11, transformers 5.17, accelerate 1.15) has numpy,
# pyarrow, pandas, tqdm, requests, huggingface_hub, packaging, pyyaml, fsspec, filelock, jinja2, psutil and
# tokenizers; the script prints each wheel's Requires-Dist so a new version's needs can be checked against that list.
#
#   trl 1.16.0         accelerate>=1.10.1 datasets>=4.7.0 huggingface_hub jinja2 numpy packaging pandas psutil
#                      pyarrow>=21 pyyaml transformers>=4.56.2        (all on the image but datasets)
#   datasets 5.2.0     dill<0.4.2 multiprocess<0.70.20 xxhash fsspec<=2026.9.0 huggingface-hub>=1.31 pyarrow>=24 ...
#                      (the 2026-11-27 GPU.md check: TRL 1.16.0 with datasets 5.2.0 trains on that image)
#   multiprocess 0.70.19   dill>=0.4.1
#   dill 0.4.1, xxhash 3.x (a manylinux cp312 wheel; the image lists xxhash too, this copy only shadows it)
#
# Then, in a device call that carries [".trlwhl"] (beside FA4's .fa4b: see ../shared/gpu/fa4-wheels.sh):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/trl .trlwhl/*.whl && export PYTHONPATH=/tmp/trl:$PYTHONPATH
set -euo pipefail
grep -qx "/.trlwhl/" .git/info/exclude 2>/dev/null || echo "/.trlwhl/" >> .git/info/exclude
rm -rf .trlwhl && mkdir -p .trlwhl
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .trlwhl "$@"; }
for wheel in trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==3.6.0; do dl "$wheel"; done
for w in .trlwhl/*.whl; do
  echo "$(basename "$w"): $(unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
    | sed 's/^Requires-Dist: //' | tr '\n' ' ')"
done
du -sh .trlwhl
echo "On the device (carry [\".trlwhl\"]):"
echo 'python3 -m pip install -q --no-index --no-deps --target /tmp/trl .trlwhl/*.whl && export PYTHONPATH=/tmp/trl:$PYTHONPATH'

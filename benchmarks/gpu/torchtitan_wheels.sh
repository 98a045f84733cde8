#!/usr/bin/env bash
# Stage torchtitan's side of benchmarks/gpu/scale_8b.py for the GPU machine: the wheels of torchtitan and of what it
# imports that the device image lacks, into the git-ignored .ttwhl/ (about 3 MB; one device call carries 64 MiB in all,
# and FA4's .fa4b/ takes about 42 MB of it). Run from the repository root. Every wheel is pure Python but xxhash.
#
# Which torchtitan. The image runs torch 2.11.0. torchtitan 0.3.0 (PyPI, pure Python) is built against a later torch:
# on torch 2.11 its import stops at `from torch.distributed.fsdp import DataParallelMeshDims` (torch 2.11 has no such
# name), and past a stand-in for it its varlen attention passes `num_splits=` and `enable_gqa=` to
# torch.nn.attention.varlen.varlen_attn, which torch 2.11 does not take (checked 2026-11-27 on torch 2.11.0+cu130's
# own sources). So the benchmark runs torchtitan 0.2.2 (2026-02-20, the last release before 0.3.0; it imports and
# builds its Llama 3.1 8B on torch 2.11), and carries 0.3.0 in .ttwhl/v030/ only so that the device call can record
# its import failure there (scale_8b.py --plan does, first, in seconds).
#
#   torchtitan 0.2.2   torchdata>=0.8.0 datasets>=2.21.0 tokenizers tomli fsspec tyro tensorboard einops pillow
#     on the image:    tokenizers, fsspec, pillow (matplotlib's); tomli: Python 3.12 has tomllib, never imported
#     carried here:    torchdata 0.11.0 (its StatefulDataLoader), tyro 1.0.17 + docstring-parser + typeguard +
#                      typing_extensions 4.16.0, the newest: it shadows the image's (tyro parses the CLI), datasets 5.2.0 + dill + multiprocess + xxhash (imported
#                      at torchtitan's import, never used: the benchmark's rows are synthetic; the TRL comparison's set,
#                      checked on the image 2026-11-27)
#     not carried:     tensorboard (torch.utils.tensorboard imports it at torchtitan's import; the launcher,
#                      benchmarks/gpu/_scale_8b_titan.py, stands a stub in for it when it is missing: tensorboard is
#                      off), einops (Flux only)
#   torchtitan 0.3.0   + spmd_types==0.2.3 (its pin) + torch_checkpointing 0.1.1 (needs torch>=2.11), in .ttwhl/v030/
#
# Then, on the device, in the call that carries [".fa4b", ".ttwhl"] (see ../shared/gpu/fa4-wheels.sh for .fa4b):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tt .ttwhl/*.whl && export PYTHONPATH=/tmp/tt:$PYTHONPATH
# (scale_8b.py --plan installs .ttwhl/v030/ into /tmp/tt030 itself, for its import check.)
set -euo pipefail
grep -qx "/.ttwhl/" .git/info/exclude 2>/dev/null || echo "/.ttwhl/" >> .git/info/exclude
rm -rf .ttwhl && mkdir -p .ttwhl/v030
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$@"; }
for wheel in torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 \
  typing_extensions==4.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==3.6.0; do dl .ttwhl "$wheel"; done
for wheel in torchtitan==0.3.0 spmd_types==0.2.3 torch_checkpointing==0.1.1; do dl .ttwhl/v030 "$wheel"; done
for w in .ttwhl/*.whl .ttwhl/v030/*.whl; do
  echo "$(basename "$w"): $(unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
    | sed 's/^Requires-Dist: //' | tr '\n' ' ')"
done
du -sh .ttwhl
echo "On the device (carry [\".fa4b\", \".ttwhl\"]):"
echo 'python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tt .ttwhl/*.whl && export PYTHONPATH=/tmp/tt:$PYTHONPATH'

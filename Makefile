# `make demo` and `make test` work from a clean clone: they create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-oldest bench bench-gpu install clean

$(VENV)/.installed-dev: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV) dev

$(VENV)/.installed-dev-bench: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV) dev,bench

install: $(VENV)/.installed-dev

demo: $(VENV)/.installed-dev
	$(PY) examples/demo.py

# two workers (pytest-xdist) of one thread each (tiny tensors: a second thread only contends), a test file each
# at a time: the files' module fixtures are built once
test: $(VENV)/.installed-dev
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist loadfile

# The oldest torch / transformers / datasets / accelerate that pyproject.toml claims, in a venv of
# their own (scripts/install_oldest.sh reads the floors from pyproject.toml). Not the `slow` tests
# (multi-process and compile runs): CI has 2 cores.
OLDEST ?= .venv-oldest
$(OLDEST)/.installed-oldest: pyproject.toml scripts/install_oldest.sh
	bash scripts/install_oldest.sh $(OLDEST)

test-oldest: $(OLDEST)/.installed-oldest
	$(OLDEST)/bin/python -m pytest -m "not slow"
	@cat $(OLDEST)/torch-floor-not-tested 2>/dev/null || true

bench: $(VENV)/.installed-dev-bench
	$(PY) benchmarks/cpu/bench_engine.py
	$(PY) benchmarks/cpu/bench_collator.py
	$(PY) benchmarks/cpu/bench_offline.py in-memory --out benchmarks/results/pack_dataset
	$(PY) benchmarks/cpu/bench_offline.py at-scale   # 1M and 3M examples: 6.6 GiB of input at 3M plus both caches on disk
	$(PY) benchmarks/cpu/bench_offline.py streaming
	$(PY) benchmarks/cpu/bench_sampler.py
	$(PY) benchmarks/cpu/bench_cli_analyze.py
	$(PY) benchmarks/collect_results.py

# `make bench-gpu`: the GPU tables of docs/benchmarks.md in one command, on a CUDA machine where this package and FA4 are
# installed (the package with its `fa4` extra; Hopper or Blackwell). Runs the Python on PATH (GPU_PY), not the venv.
# Each step is bounded by `timeout` and a failed or timed-out step does not stop the others (make's `-`);
# about 105 minutes on one H100/H200 in all. Results: $(GPU_OUT)/<table>/ (train_throughput.md, results.json).
GPU_PY ?= python
GPU_OUT ?= benchmarks/results/bench_gpu
TT = $(GPU_PY) benchmarks/gpu/train_throughput.py
FA4_COLUMNS = --eval-every 0 --timing window --modes uniform,multipack --attn packing_fa4,flash_attention_4,packing_varlen --oracle-attn sdpa
LONG = $(TT) --size 1b --grad-checkpointing --eval-every 0 --rounds 3 --attn flash_attention_4,packing_varlen \
	--oracle-attn sdpa,flash_attention_4 --modes padded_random,padded_grouped,multipack,uniform,uniform_work
LONG_32K = --steps 3 --warmup 1 --tokens-per-step 65536 --micro-tokens 65536 --max-length 32768 --batch-size 2

bench-gpu:
	mkdir -p $(GPU_OUT)
	# "GPU: training throughput": 200M, every mode, 3 alternating rounds (~3 min per distribution on an H200)
	-for d in flan_like orcamath_like sft; do timeout 900 $(TT) --size 200m --rounds 3 --distributions $$d --attn packing_varlen --out $(GPU_OUT)/train_throughput_200m/$$d; done
	# "GPU: FlashAttention-4", share of the oracle: 200M (5 rounds) and 1B (4 rounds), --timing window
	-timeout 1500 $(TT) --size 200m --rounds 5 $(FA4_COLUMNS) --out $(GPU_OUT)/fa4_200m
	-timeout 1800 $(TT) --size 1b --rounds 4 --steps 12 --warmup 4 --examples 8000 $(FA4_COLUMNS) --out $(GPU_OUT)/fa4_1b
	# "GPU: long context", 1B with gradient checkpointing: long_tail at 8k and 32k, reasoning at 32k (~8 min each)
	-timeout 900 $(LONG) --steps 4 --warmup 2 --tokens-per-step 32768 --micro-tokens 32768 --max-length 8192 --batch-size 4 --distributions long_tail --examples 4000 --out $(GPU_OUT)/long_tail_8k
	-timeout 900 $(LONG) $(LONG_32K) --distributions long_tail --examples 3000 --out $(GPU_OUT)/long_tail_32k
	-timeout 900 $(LONG) $(LONG_32K) --distributions reasoning --examples 1500 --out $(GPU_OUT)/reasoning_32k
	# "GPU: under torch.compile": compiled packed vs the compiled oracles and eager, 200M and 1B (~2-3 min each)
	-timeout 600 $(GPU_PY) benchmarks/gpu/compile_throughput.py --size 200m --out $(GPU_OUT)/compile_200m
	-timeout 600 $(GPU_PY) benchmarks/gpu/compile_throughput.py --size 1b --out $(GPU_OUT)/compile_1b
	# packed attention is exact: losses against padded sdpa, per kernel and under FA4 (~2 min each)
	-timeout 600 $(GPU_PY) benchmarks/gpu/exactness.py attention --out $(GPU_OUT)/gpu_attention
	-timeout 600 $(GPU_PY) benchmarks/gpu/exactness.py fa4 --attn packing_fa4 --out $(GPU_OUT)/fa4_check
	# hybrid and vision-language models (flash-linear-attention installed for the Qwen3.5 one; ~5 min each)
	-timeout 600 $(GPU_PY) benchmarks/gpu/hybrid_throughput.py --model qwen3_5 --modes packed,oracle,padded --out $(GPU_OUT)/hybrid
	-timeout 600 $(GPU_PY) benchmarks/gpu/hybrid_throughput.py --model nemotron_h --tokens-per-step 4096 --modes packed,oracle,padded --out $(GPU_OUT)/hybrid
	-timeout 600 $(GPU_PY) benchmarks/gpu/vlm_throughput.py --out $(GPU_OUT)/vlm
	ls -R $(GPU_OUT)

clean:
	rm -rf $(VENV) $(OLDEST) .pytest_cache

# `make demo` and `make test` work from a clean clone: they create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-oldest bench install clean

$(VENV)/.installed-dev: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV) dev

$(VENV)/.installed-dev-bench: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV) dev,bench

install: $(VENV)/.installed-dev

demo: $(VENV)/.installed-dev
	$(PY) examples/demo.py

test: $(VENV)/.installed-dev
	$(PY) -m pytest

# The oldest torch / transformers / datasets / accelerate that pyproject.toml claims, in a venv of
# their own (scripts/install_oldest.sh reads the floors from pyproject.toml). Not the `slow` tests
# (multi-process and compile runs): CI has 2 cores.
OLDEST ?= .venv-oldest
$(OLDEST)/.installed-oldest: pyproject.toml scripts/install_oldest.sh
	bash scripts/install_oldest.sh $(OLDEST)

test-oldest: $(OLDEST)/.installed-oldest
	$(OLDEST)/bin/python -m pytest -m "not slow"

bench: $(VENV)/.installed-dev-bench
	$(PY) benchmarks/cpu/bench_engine.py
	$(PY) benchmarks/cpu/bench_collator.py
	$(PY) benchmarks/cpu/bench_pack_dataset.py --out benchmarks/results/pack_dataset
	$(PY) benchmarks/cpu/bench_pack_at_scale.py   # 1M and 3M examples: 6.6 GiB of input at 3M plus both caches; TRL peaks at 7.3 GiB RAM
	$(PY) benchmarks/cpu/bench_streaming.py
	$(PY) benchmarks/cpu/bench_sampler.py
	$(PY) benchmarks/cpu/bench_cli_analyze.py
	$(PY) benchmarks/collect_results.py

clean:
	rm -rf $(VENV) $(OLDEST) .pytest_cache

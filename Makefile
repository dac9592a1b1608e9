# Two commands a newcomer needs: `make demo` and `make test`. Each sets up .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BENCH  := $(VENV)/.installed-bench
MMLAB  := $(VENV)/.installed-openmmlab

.PHONY: help demo test bench bench-gpu clean gpu-report gpu-check
.DEFAULT_GOAL := help

help:
	@echo "make demo        set up .venv if missing and run every operator on its network cases (a few minutes)"
	@echo "make test        set up .venv if missing and run the test suite (CPU; Triton under its interpreter)"
	@echo "make bench       every network case, full timing, results and plot in benchmarks/results/"
	@echo "make bench-gpu   the same on a machine with an NVIDIA GPU"
	@echo "make gpu-check   on a GPU machine with torch and triton: correctness and speed of every Triton kernel"
	@echo "make gpu-report  compile every Triton kernel for sm_80/sm_90a (no GPU needed): registers, spills"
	@echo "make clean       remove .venv and build outputs"

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	# torch pinned here only: 2.13.0 resolves to the CPU wheel on this machine (a bare `torch` pulls CUDA).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

# The OpenMMLab packages whose model code tests/test_openmmlab.py runs on cvops: their needs first, then the
# packages themselves with --no-deps (their metadata asks for a compiled mmcv; see requirements/openmmlab.txt).
$(MMLAB): $(STAMP) requirements/openmmlab.txt requirements/openmmlab-needs.txt
	$(PY) -m pip install -q -r requirements/openmmlab-needs.txt
	$(PY) -m pip install -q --no-deps -r requirements/openmmlab.txt
	touch $(MMLAB)

# Benchmarks also time the anchors (spconv), show progress and tables with rich and plot with matplotlib;
# tests need none of them.
$(BENCH): $(STAMP)
	$(PY) -m pip install -q -e ".[test,bench,plot]"
	touch $(BENCH)

# The network cases minus larger batches of cases already shown, quick timing, a verdict per op in words.
demo: $(BENCH)
	$(PY) benchmarks/run_all.py --demo

test: $(STAMP) $(MMLAB)
	$(PY) -m pytest -n 2 tests

# Every network case, full timing and tables, first calls in fresh processes; results (json, md, IO-efficiency
# plot) in benchmarks/results/.
bench: $(BENCH)
	$(PY) benchmarks/run_all.py --results benchmarks/results --plot --first-call

clean:
	rm -rf $(VENV) build src/*.egg-info

# On a machine with an NVIDIA GPU: every op's network cases with CUDA tensors, results kept in benchmarks/results/.
bench-gpu: $(BENCH)
	$(PY) -m pip install -q triton
	$(PY) benchmarks/run_all.py --device cuda --results benchmarks/results

# No GPU needed: compiles every Triton kernel for sm_80 and sm_90a and prints registers, spills, shared
# memory and occupancy per kernel (tools/gpu_report.py --tests records the triton op tests' launches instead).
gpu-report: $(STAMP)
	$(PY) tools/gpu_report.py

# On a GPU machine, with its own python3 (torch + triton, no venv, no install): correctness and speed of every
# Triton kernel, results in gpu-check-out/ (tools/gpu_check.py --help).
gpu-check:
	PYTHONPATH=src python3 tools/gpu_check.py --out gpu-check-out

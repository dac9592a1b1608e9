# Two commands a newcomer needs: `make demo` and `make test`. Each sets up .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BENCH  := $(VENV)/.installed-bench
MMLAB  := $(VENV)/.installed-openmmlab
# pip's own output (progress, and the "Location ... is ignored" warnings some index setups print on every
# install) goes to a log that is shown only when pip fails; each step says in one line what it installs.
PIP_Q  := $(PY) -m pip install -q --progress-bar off
LOGGED  = > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }

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

# torch pinned here only: 2.13.0 resolves to the CPU wheel on this machine (a bare `torch` pulls CUDA).
$(STAMP): pyproject.toml
	@echo "setup: creating the virtual environment $(VENV)"
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing torch 2.13.0 (the CPU build; the longest step, a minute or more)"
	@$(PIP_Q) torch==2.13.0 $(LOGGED)
	@echo "setup: installing cvops (editable) with numba, and the test tools (pytest, hypothesis, triton)"
	@$(PIP_Q) -e ".[test]" $(LOGGED)
	@touch $(STAMP)

# The OpenMMLab packages whose model code tests/test_openmmlab.py runs on cvops: their needs first, then the
# packages themselves with --no-deps (their metadata asks for a compiled mmcv; see requirements/openmmlab.txt).
$(MMLAB): $(STAMP) requirements/openmmlab.txt requirements/openmmlab-needs.txt
	@echo "setup: installing mmengine, mmcv-lite, mmdet, mmsegmentation and mmdet3d (their model code is tested on cvops)"
	@$(PIP_Q) -r requirements/openmmlab-needs.txt $(LOGGED)
	@$(PIP_Q) --no-deps -r requirements/openmmlab.txt $(LOGGED)
	@touch $(MMLAB)

# Benchmarks also time the anchors (spconv), show progress with rich and draw their picture with matplotlib.
$(BENCH): $(STAMP)
	@echo "setup: installing the benchmarks' extras: spconv (an anchor), rich (progress), matplotlib (the picture)"
	@$(PIP_Q) -e ".[test,bench]" $(LOGGED)
	@touch $(BENCH)

# One network case per op and direction (cases tagged "demo"), quick timing, one line per case, a paragraph
# per op in words, the machine's load, and a picture (its path printed at the end).
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

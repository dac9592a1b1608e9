# Two commands a newcomer needs: `make demo` and `make test`. Each sets up .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BENCH  := $(VENV)/.installed-bench
# pip's own output (progress, and the "Location ... is ignored" warnings some index setups print on every
# install) goes to a log that is shown only when pip fails; each step says in one line what it installs.
PIP_Q  := $(PY) -m pip install -q --progress-bar off
LOGGED  = > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }

.PHONY: demo test bench bench-gpu clean gpu-report

# torch pinned here only: 2.13.0 resolves to the CPU wheel on this machine (a bare `torch` pulls CUDA).
$(STAMP): pyproject.toml
	@echo "setup: creating the virtual environment $(VENV)"
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing torch 2.13.0 (the CPU build; the longest step, a minute or more)"
	@$(PIP_Q) torch==2.13.0 $(LOGGED)
	@echo "setup: installing cvops (editable) with numba, and the test tools (pytest, hypothesis, triton)"
	@$(PIP_Q) -e ".[test]" $(LOGGED)
	@touch $(STAMP)

# Benchmarks also time the anchors (spconv), show progress with rich and draw their picture with matplotlib.
$(BENCH): $(STAMP)
	@echo "setup: installing the benchmarks' extras: spconv (an anchor), rich (progress), matplotlib (the picture)"
	@$(PIP_Q) -e ".[test,bench]" $(LOGGED)
	@touch $(BENCH)

# One network case per op and direction (cases tagged "demo"), quick timing, one line per case, a paragraph
# per op in words, the machine's load, and a picture (its path printed at the end).
demo: $(BENCH)
	$(PY) benchmarks/run_all.py --demo

test: $(STAMP)
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

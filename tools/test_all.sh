#!/usr/bin/env bash
# make test: every test of the book, its phases side by side on a 2-core machine.
#
#   1. the unit tests (pytest -m "not built_book") beside every chapter executed for the book
#      (tools/execute_book.py, two at a time, asserts included);
#   2. the page rendering (jupyter-book, warnings are errors) and then the browser tests of the
#      pages' own scripts, beside the chapters with a live explorer run again under nbval on
#      Colab's widget versions (tools/colab_env.py), loading what phase 1 trained
#      (SELFATTN_TRAIN_CACHE, see selfattn.book.kit.train);
#   3. the tests that read the built book.
#
# The Makefile calls it after lint, the browser check and the set-up (.venv, _vendor, the font).
# Every phase runs to its end; the script fails if any of them failed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
MAKE=${MAKE:-make}
TRAIN_CACHE="$PWD/_build/.train-cache"
# the built book's tests that need nothing from the Colab run: they run as soon as it is built
PAGE_SCRIPT_TESTS=(tests/test_live_browser.py tests/test_selfcheck_browser.py)
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

# The chapters with a live explorer: a code line that starts with `explorer(`.
explorer_chapters() {
    grep -lP '^ *"explorer\(' chapters/*.ipynb
}

# Phase 1: the unit tests, and beside them every chapter executed for the book.
unit_and_chapters() {
    local unit=0 ran=0 executed
    rm -rf "$TRAIN_CACHE"
    (OMP_NUM_THREADS=1 SELFATTN_TRAIN_CACHE="$TRAIN_CACHE" "$MAKE" --no-print-directory executed \
        > "$LOG" 2>&1) &
    executed=$!
    OMP_NUM_THREADS=1 "$PY" -m pytest -m "not built_book" tests || unit=$?
    OMP_NUM_THREADS=1 "$PY" tools/gpu_report.py --rehearse || unit=$?  # make gpu-rehearsal
    wait "$executed" || ran=$?
    cat "$LOG"
    if [ "$ran" -ne 0 ]; then
        echo "a chapter failed (exit $ran)"
        exit "$ran"
    fi
    return "$unit"
}

# Phase 2: the page rendering and the page scripts' browser tests, beside the explorer chapters
# on Colab's widget versions.
render_and_colab() {
    local chapters=0 built=0 book
    (OMP_NUM_THREADS=1 "$MAKE" --no-print-directory book > "$LOG" 2>&1 &&
        "$PY" -m pytest "${PAGE_SCRIPT_TESTS[@]}" >> "$LOG" 2>&1) &
    book=$!
    mapfile -t explorers < <(explorer_chapters)
    OMP_NUM_THREADS=1 SELFATTN_TRAIN_CACHE="$TRAIN_CACHE" \
        "$PY" tools/colab_env.py pytest --nbval-lax "${explorers[@]}" || chapters=$?
    wait "$book" || built=$?
    cat "$LOG"
    if [ "$built" -ne 0 ]; then
        echo "make book or its page-script tests failed"
        exit "$built"
    fi
    return "$chapters"
}

# Phase 3: the tests that read the built book.
built_book() {
    local ignore=()
    for t in "${PAGE_SCRIPT_TESTS[@]}"; do ignore+=("--ignore=$t"); done
    "$PY" -m pytest -m built_book "${ignore[@]}" tests
}

main() {
    local unit=0 chapters=0 late=0
    unit_and_chapters || unit=$?
    render_and_colab || chapters=$?
    built_book || late=$?
    [ "$unit" -eq 0 ] && [ "$chapters" -eq 0 ] && [ "$late" -eq 0 ]
}

main "$@"

#!/usr/bin/env bash
# make test: every test of the book, in three phases, each keeping both cores of a 2-core
# machine busy:
#
#   1. lint and the type check, then the fast tests (pytest -m "not slow and not built_book":
#      make unit runs the same), beside every chapter executed for the book
#      (tools/execute_book.py, two at a time, asserts included), with tests/harness.py in
#      each chapter's kernel recording every figure's text size and driving every explorer
#      live (into _build/harness/);
#   2. the slow tests (pytest -m "slow and not built_book") beside the page rendering
#      (jupyter-book, warnings are errors; seconds) and make gpu's rehearsal on this CPU
#      (tools/gpu_report.py --rehearse), which needs no built book;
#   3. the tests that read the built book (pytest -m built_book), the browser tests among them,
#      on both cores (pytest-xdist: each test keeps its findings to itself).
#
# The Makefile calls it after the browser check and the set-up (.venv, _vendor, the font).
# A phase runs to its end even when one of its halves failed; a failed chapter or a failed
# rendering stops the script there, since nothing after it could pass.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
MAKE=${MAKE:-make}
export OMP_NUM_THREADS=1
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT

# Run "$@" in the background with its output in $LOGS/$1; the caller waits for $!.
in_background() {
    local log=$1
    shift
    ("$@" > "$LOGS/$log" 2>&1) &
}

# Wait for the background job $2, print its output ($LOGS/$1); its exit status is the
# function's.
finish() {
    local status=0
    wait "$2" || status=$?
    cat "$LOGS/$1"
    return "$status"
}

phase() {
    printf '\n== make test, phase %s (%s s so far) ==\n' "$1" "$SECONDS"
}

fast_tests_and_chapters() {
    local tests=0 chapters=0 job
    phase "1: lint and the fast tests, beside every chapter executed for the book"
    in_background chapters "$MAKE" --no-print-directory executed RECORD=_build/harness
    job=$!
    "$MAKE" --no-print-directory lint || tests=$?
    "$PY" -m pytest -m "not slow and not built_book" tests || tests=$?
    finish chapters "$job" || chapters=$?
    if [ "$chapters" -ne 0 ]; then
        echo "a chapter failed (exit $chapters)"
        exit "$chapters"
    fi
    return "$tests"
}

slow_tests_and_rendering() {
    local tests=0 built=0 book rehearsal
    phase "2: the slow tests, beside the page rendering and the GPU rehearsal"
    in_background book "$MAKE" --no-print-directory book
    book=$!
    in_background rehearsal "$PY" tools/gpu_report.py --rehearse  # make gpu-rehearsal
    rehearsal=$!
    "$PY" -m pytest -m "slow and not built_book" tests || tests=$?
    finish rehearsal "$rehearsal" || tests=$?
    finish book "$book" || built=$?
    if [ "$built" -ne 0 ]; then
        echo "make book failed (exit $built)"
        exit "$built"
    fi
    return "$tests"
}

built_book_tests() {
    phase "3: the tests that read the built book, on both cores"
    "$PY" -m pytest -n 2 -m built_book tests
}

main() {
    local fast=0 slow=0 built=0
    fast_tests_and_chapters || fast=$?
    slow_tests_and_rendering || slow=$?
    built_book_tests || built=$?
    phase "done"
    [ "$fast" -eq 0 ] && [ "$slow" -eq 0 ] && [ "$built" -eq 0 ]
}

main "$@"

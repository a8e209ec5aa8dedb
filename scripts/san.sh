#!/usr/bin/env bash
# Runs the tests of every crate under AddressSanitizer: reads and writes out of bounds
# or after a free, double frees, and memory leaked at exit. The unit tests drive the
# unsafe code (the fastbox rings, cells and queues over heap-backed regions, the copies
# of the large-message strategies, the two-sided and one-sided engines between threads),
# and the multi-process tests start nemesis-run, the examples and their own child ranks
# built the same way, so a wrong offset or a buffer used after its request ends shows
# up here as a report with both stacks, where a plain run might pass.
#
#   scripts/san.sh [CARGO-TEST-ARGS...]     (for example: -p nemesis-shm --lib)
#
# Without arguments it runs the unit and integration tests of the workspace (not the
# doctests, nor the loom models, which are built for loom). The build goes to
# target/asan. Sanitizer flags are accepted only by nightly compilers; on a stable
# toolchain this script sets RUSTC_BOOTSTRAP=1 for this build only, as scripts/fuzz.sh
# does. The leaks the tests make on purpose are listed,
# each with its reason, in scripts/lsan.supp; any other leak fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
    -h|--help) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

host=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$host" ] || { echo "san: cannot read the host triple from rustc -vV" >&2; exit 1; }
case "$host" in
    x86_64-unknown-linux-gnu|aarch64-unknown-linux-gnu) ;;
    *) echo "san: AddressSanitizer is not set up here for $host; skipped" >&2; exit 0 ;;
esac
if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi
args=("$@")
if ((${#args[@]} == 0)); then
    args=(--workspace --exclude loom-tests --lib --tests)
fi
# The target is named so that the flags reach only the code under test, not build
# scripts and procedural macros, which run on the host uninstrumented; through the
# environment, so that the cargo a test runs to build nemesis-run or an example builds
# it the same way, into the same directory.
RUSTFLAGS="-Zsanitizer=address" \
    CARGO_TARGET_DIR=target/asan \
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}" \
    LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}" \
    CARGO_BUILD_TARGET="$host" \
    cargo test --locked --no-fail-fast "${args[@]}"

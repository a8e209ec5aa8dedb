#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for a while.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s, all targets)
#
# Installs cargo-fuzz when it is missing. libFuzzer needs the compiler's sanitizer
# flags, which only nightly toolchains accept; on a stable toolchain this script sets
# RUSTC_BOOTSTRAP=1 for the fuzz build only.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
[[ "$secs" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2; }
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=("$@")
if ((${#targets[@]} == 0)); then
    mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi
if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi
cd fuzz
for t in "${targets[@]}"; do
    echo "== fuzzing $t for ${secs}s"
    cargo fuzz run "$t" -- -max_total_time="$secs" -print_final_stats=1 2>&1 | grep -E '^(stat::number_of_executed_units|Done|==|INFO: Running)|ERROR|panicked' || true
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fuzz target $t failed" >&2; exit 1; }
done

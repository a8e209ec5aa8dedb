#!/usr/bin/env bash
# Runs every test of nemesis: formatting and lints, the unit and multi-process tests,
# the loom models, and a short run of the instruction-count script.
#
#   scripts/test.sh
#
# It installs the system packages the tests need (valgrind) with apt-get when they are
# missing. LOOM_MAX_PREEMPTIONS, when set, overrides each model's preemption bound.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
if ((${#missing[@]})); then
    step "installing ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

step "format"
cargo fmt --all -- --check

step "lints"
cargo clippy --locked --workspace --all-targets -- -D warnings

step "unit and multi-process tests"
cargo test --locked --workspace

step "loom models (lock-free protocols of nemesis-shm, with broken variants that must fail)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo clippy --locked -p loom-tests --all-targets -- -D warnings
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --locked -p loom-tests --release

step "instruction count script"
scripts/icount.sh channel 1000

step "all tests passed"

#!/usr/bin/env bash
# Runs every test of nemesis: formatting, lints and documentation, the unit and
# multi-process tests, the async tests, the tests under a one-node Slurm cluster, the
# verbs netmods in a Soft-RoCE VM, the loom models, a short run of the instruction-count
# script, the tests again under AddressSanitizer, and the fuzz targets.
#
#   scripts/test.sh
#
# It installs what the tests need when it is missing: valgrind (instruction counts),
# MPICH (Hydra's mpiexec and mpicc, for the interoperability tests), iproute2 (network
# namespaces for the multi-host tests), nftables (a lossy link for udp), with apt-get;
# cargo-fuzz with cargo.
# LOOM_MAX_PREEMPTIONS, when set, overrides each model's preemption bound;
# FUZZ_SECONDS (default 20) is how long each fuzz target runs.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v mpiexec.mpich >/dev/null || missing+=(mpich)
command -v mpicc.mpich >/dev/null || missing+=(libmpich-dev)
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
if ((${#missing[@]})); then
    step "installing ${missing[*]}"
    $sudo apt-get -o DPkg::Lock::Timeout=900 update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=900 install -y --no-install-recommends "${missing[@]}"
fi

step "format"
cargo fmt --all -- --check

step "lints"
scripts/modcycles.py
cargo clippy --locked --workspace --all-targets -- -D warnings
cargo clippy --locked --workspace --all-targets --features nemesis/async -- -D warnings

step "documentation"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --workspace --features nemesis/async

step "unit and multi-process tests"
cargo test --locked --workspace

step "async: futures, the progress thread, the tokio example, idle ranks that sleep"
cargo test --locked -p nemesis --features async --test aio

step "under Slurm: srun --mpi=pmi2 on a one-node cluster"
$sudo scripts/slurm.sh start >/dev/null
trap '$sudo scripts/slurm.sh stop' EXIT
eval "$(scripts/slurm.sh env)"
NEM_TEST_SLURM=1 cargo test --locked -p nemesis --test slurm -- --test-threads=1

step "verbs netmods: the conformance suite over ud in a Soft-RoCE VM"
scripts/verbs-test.sh

step "loom models (lock-free protocols of nemesis-shm, with broken variants that must fail)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo clippy --locked -p loom-tests --all-targets -- -D warnings
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --locked -p loom-tests --release

step "instruction count script"
scripts/icount.sh channel 1000
scripts/icount.sh p2p 1000
scripts/icount.sh stream-phases 640
scripts/icount.sh rma-put 1000

step "A/B script, and the cache-hint switches build clean"
ab=$(scripts/ab.sh --turns 2 --b-env NEMESIS_FBOX_READ_AHEAD=1 -- msgrate --sizes 8 --rounds 1 --iters 100 --warmup 10)
printf '%s\n' "$ab"
grep -q '^msgrate/p2p/shm 8 B msgs_per_s' <<<"$ab"
RUSTFLAGS="--cfg nemesis_no_prefetchw --cfg nemesis_no_reply_claim" CARGO_TARGET_DIR=target/nohints \
    cargo clippy --locked -p nemesis-shm -- -D warnings

step "unit and multi-process tests under AddressSanitizer"
scripts/san.sh

step "fuzz targets"
scripts/fuzz.sh "${FUZZ_SECONDS:-20}"

step "all tests passed"

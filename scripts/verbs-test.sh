#!/usr/bin/env bash
# Runs the tests of the verbs netmods: lints and the verbs layer's unit tests on this
# host, then inside a VM with a Soft-RoCE device (the rxe-vm tool, ../shared/tools/rxe-vm,
# or RXE_VM_TOOL) the netmod conformance suite over ud and rc and jobs over both (the
# two-sided stress test, the examples, the one-sided checks), in one VM and across two.
# Only the verbs test binaries run in the VM.
#
#   scripts/verbs-test.sh
#
# It installs what the `verbs` feature needs to build (cmake, libclang) and what the VM
# needs (rxe-vm's setup.sh: qemu, rdma-core, a Debian kernel) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

tool=${RXE_VM_TOOL:-../shared/tools/rxe-vm}
if [ ! -x "$tool/run.sh" ]; then
    echo "verbs-test: the Soft-RoCE VM tool is not at $tool (set RXE_VM_TOOL to its directory)" >&2
    exit 1
fi
tool=$(cd "$tool" && pwd)
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi

missing=()
command -v cmake >/dev/null || missing+=(cmake)
# bindgen needs libclang itself (libclang-cpp, which other packages bring, is not it).
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || missing+=(libclang-dev)
if ((${#missing[@]})); then
    echo "verbs-test: installing ${missing[*]}"
    $sudo apt-get -o DPkg::Lock::Timeout=900 update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=900 install -y --no-install-recommends "${missing[@]}"
fi
"$tool/setup.sh" || { sleep 30; "$tool/setup.sh"; }

echo "verbs-test: lints and documentation with the verbs feature"
cargo clippy --locked -p nemesis-net --all-targets --features verbs -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps -p nemesis-net --features verbs

echo "verbs-test: the verbs layer on the host (no device here: the device tests skip)"
cargo test --locked -p nemesis-net --features verbs --lib verbs

# A VM that dies before its command gives a status (exit 125) is started once more:
# scripts/vm-retry.sh. A failing test is never retried.
retry=$PWD/scripts/vm-retry.sh
runner="$retry $tool/run.sh --timeout 600 --rw $PWD/target --"

echo "verbs-test: the conformance suite over ud in the Soft-RoCE VM"
cargo test --locked -p nemesis-net --features verbs --test verbs --no-run
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$runner" \
    cargo test --locked -p nemesis-net --features verbs --test verbs -- --test-threads=1

echo "verbs-test: past the memory-lock limit as an unprivileged user, a clear error"
bin=$(cargo test --locked -p nemesis-net --features verbs --test verbs --no-run --message-format=json |
    grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
"$retry" "$tool/run.sh" --timeout 300 --rw "$PWD/target" -- \
    setpriv --reuid=65534 --regid=65534 --clear-groups -- env NEM_TEST_MEMLOCK=1 \
    bash -c 'ulimit -l 8192 && exec "$0" --exact registration_past_the_memory_lock_limit_names_ulimit' "$bin"

echo "verbs-test: jobs over ud (stress test, examples) in the Soft-RoCE VM"
# Built here first: cargo inside the emulated VM is slow.
cargo build --locked -p nemesis-tools --bin nemesis-run
cargo build --locked -p nemesis --features verbs --example hello --example ring --example halo
bin=$(cargo test --locked -p nemesis --features verbs --test verbs --no-run --message-format=json |
    grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
NEM_TEST_PREBUILT=1 CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$runner" \
    cargo test --locked -p nemesis --features verbs --test verbs -- --test-threads=1

# Two VMs: run2.sh exits 125 when a VM or its setup fails before the command runs (the
# emulated boot sometimes does, rxe-vm's README says); that, and only that, is tried once
# more.
two_vm() { "$retry" "$tool/run2.sh" "$@"; }

# The link loses, duplicates and reorders datagrams: the reliability layer must repair it,
# so every byte goes through it (ud's RDMA side off). Large messages read over RC pairs
# would rely on the device's retransmission instead, which rxe does after an ACK timeout
# of a second a try: a lossy link is no place for them.
netem='delay 1ms loss 5% duplicate 1% reorder 10%'
echo "verbs-test: a job across two Soft-RoCE VMs over ud without RDMA (hello, ring, stress test), link: $netem"
VERBS_NETMOD=ud VERBS_UD_RDMA=0 VERBS_JOB_BIN=$bin two_vm --netem "$netem" --timeout 600 --rw "$PWD/target" -- \
    scripts/verbs-two-vm.sh -- scripts/verbs-two-vm.sh
echo "verbs-test: a job across two Soft-RoCE VMs over ud, large messages read by RDMA (hello, a ring of 30 laps, stress test)"
VERBS_NETMOD=ud VERBS_RING_LAPS=30 VERBS_JOB_BIN=$bin two_vm --timeout 600 --rw "$PWD/target" -- \
    scripts/verbs-two-vm.sh -- scripts/verbs-two-vm.sh
# rc on a clean link, with a short ring: rxe's RC between the two emulated VMs
# retransmits about every other message even so (rxe-vm's README says to keep RC counts
# small there). The stress test's large messages go by RDMA read now rather than bursts
# of 8 KiB sends, under which a pair sometimes heard no acknowledgement for its seven
# tries and gave up (2 runs of 7 before); 8 runs of 8 passed since.
echo "verbs-test: a job across two Soft-RoCE VMs over rc (hello, a ring of 30 laps, stress test)"
VERBS_NETMOD=rc VERBS_RING_LAPS=30 VERBS_JOB_BIN=$bin two_vm --timeout 600 --rw "$PWD/target" -- \
    scripts/verbs-two-vm.sh -- scripts/verbs-two-vm.sh

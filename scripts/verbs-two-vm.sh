#!/usr/bin/env bash
# Runs in both Soft-RoCE VMs of rxe-vm's run2.sh (scripts/verbs-test.sh starts it): one
# nemesis job across the two VMs, two ranks in each, shared memory within a VM and the
# verbs netmod $VERBS_NETMOD (ud or rc) between them: hello, a ring of $VERBS_RING_LAPS
# laps (100), and unless VERBS_STRESS=0 the two-sided stress test (the test binary in
# $VERBS_JOB_BIN). VM A starts the jobs with nemesis-run;
# VM B serves their launches. VERBS_UD_RDMA=0 turns ud's RDMA side off
# (NEMESIS_UD_RDMA), so that every byte goes through the reliability layer.
set -euo pipefail
cd "$(dirname "$0")/.."
netmod=${VERBS_NETMOD:-ud}
export NEMESIS_NETMOD=$netmod NEM_TEST_CHILD=1 STRESS_SEED=31 STRESS_ROUNDS=8
export NEMESIS_UD_RDMA=${VERBS_UD_RDMA:-1}
if [ "$RXE_VM_ROLE" = B ]; then
    exec scripts/vm-launcher.sh --serve
fi
trap 'touch "$RXE_VM_SYNC_DIR/launch-done"' EXIT

job() {
    target/debug/nemesis-run -n 4 --hosts A,B --launcher "$PWD/scripts/vm-launcher.sh" \
        --pmi-addr "$RXE_VM_IP" --timeout 300 -- "$@"
}
expect() {
    local what=$1 line=$2 n=$3 out=$4
    local said
    said=$(grep -c -- "$line" <<<"$out" || true)
    if [ "$said" != "$n" ]; then
        printf '%s\n' "$out"
        echo "verbs-two-vm: $what: $n ranks should say \"$line\", $said did" >&2
        exit 1
    fi
    echo "verbs-two-vm: $what across two VMs over $netmod: ok"
}

out=$(job target/debug/examples/hello)
expect hello "via net" 4 "$out"
laps=${VERBS_RING_LAPS:-100}
out=$(job target/debug/examples/ring "$laps")
expect ring "$laps laps of 4 ranks" 1 "$out"
if [ "${VERBS_STRESS:-1}" = 1 ]; then
    out=$(job "${VERBS_JOB_BIN:?}" --exact child_stress --ignored --nocapture --test-threads=1)
    expect "stress test" "messages checked" 4 "$out"
    if [ "$netmod" = rc ] || [ "$NEMESIS_UD_RDMA" = 1 ]; then
        # Its messages from 70,000 bytes up went by RDMA read, on every rank.
        expect "stress test by RDMA" "rdma moved [1-9]" 4 "$out"
    fi
fi

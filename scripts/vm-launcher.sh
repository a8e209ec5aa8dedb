#!/usr/bin/env bash
# nemesis-run's launcher between the two Soft-RoCE VMs of rxe-vm's run2.sh, which share a
# directory ($RXE_VM_SYNC_DIR) but no ssh. Used by scripts/verbs-two-vm.sh.
#
#   vm-launcher.sh HOST CMD...   run CMD on HOST (A or B), its input passed through
#   vm-launcher.sh --serve       in the other VM: run what is asked of this VM until
#                                the job says it is done
#
# A request is a directory under the sync directory: the command, its input, and then its
# output and exit status, which the asking side streams back and returns.
set -euo pipefail
sync=${RXE_VM_SYNC_DIR:?vm-launcher: not inside a run2.sh VM}
me=${RXE_VM_ROLE:?vm-launcher: not inside a run2.sh VM}

if [ "${1:-}" = --serve ]; then
    declare -A started=()
    while [ ! -e "$sync/launch-done" ]; do
        for req in "$sync"/launch-"$me"-*; do
            [ -e "$req/ready" ] && [ -z "${started[$req]:-}" ] || continue
            started[$req]=1
            (
                bash -c "$(cat "$req/cmd")" <"$req/stdin" >"$req/stdout" 2>"$req/stderr" && rc=0 || rc=$?
                echo "$rc" >"$req/rc.tmp" && mv "$req/rc.tmp" "$req/rc"
            ) &
        done
        sleep 0.1
    done
    wait
    exit 0
fi

host=${1:?usage: vm-launcher.sh HOST CMD... | --serve}
shift
if [ "$host" = "$me" ]; then
    exec "$@"
fi
req=$(mktemp -d "$sync/launch-$host-XXXXXX")
printf '%q ' "$@" >"$req/cmd"
cat >"$req/stdin"
: >"$req/stdout"
: >"$req/stderr"
touch "$req/ready"
# Streams what the command writes. (tail -F would miss the end: the shared directory
# has no inotify, and tail then looks only once a second.)
declare -A done_bytes=([stdout]=0 [stderr]=0)
forward() {
    local f n
    for f in stdout stderr; do
        n=$(stat -c %s "$req/$f")
        if [ "$n" -gt "${done_bytes[$f]}" ]; then
            if [ $f = stdout ]; then
                tail -c +$((done_bytes[$f] + 1)) "$req/$f" | head -c $((n - done_bytes[$f]))
            else
                tail -c +$((done_bytes[$f] + 1)) "$req/$f" | head -c $((n - done_bytes[$f])) >&2
            fi
            done_bytes[$f]=$n
        fi
    done
}
while [ ! -e "$req/rc" ]; do
    forward
    sleep 0.2
done
forward
exit "$(cat "$req/rc")"

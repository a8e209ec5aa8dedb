#!/usr/bin/env bash
# Runs an rxe-vm command (run.sh or run2.sh and its arguments) and runs it once more when it
# exits 125: that status means the VM or its set-up failed before the command gave a status
# (qemu dying at boot, say), never that a test failed. Any other status is returned as it is.
#
#   scripts/vm-retry.sh ../shared/tools/rxe-vm/run.sh --timeout 600 -- COMMAND [ARG...]
set -uo pipefail
if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
    [ $# -eq 0 ] && exit 2
    exit 0
fi
"$@"
rc=$?
if [ "$rc" = 125 ]; then
    echo "vm-retry: the VM gave no exit status (125); once more" >&2
    "$@"
    rc=$?
fi
exit "$rc"

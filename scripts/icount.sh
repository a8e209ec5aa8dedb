#!/usr/bin/env bash
# Counts the instructions of one 8-byte send plus its receive, with the message already
# arrived, with valgrind's callgrind: a figure that does not move with the machine.
# `stream` counts one message of a window of 64 isends and 64 pre-posted irecvs, each
# side waiting for all of its window (osu_bw's inner loop), per message;
# `channel-stream` the same window of raw packets through the channel. `rma-put` counts
# an 8-byte put into a window member's shared memory and its flush, `rma-fop` an 8-byte
# fetch-and-add there, `rma-lock` an exclusive lock of the member and its unlock.
#
#   scripts/icount.sh channel|p2p|stream|channel-stream|rma-put|rma-fop|rma-lock [OPS]
#
# The last line is a JSON object with "instructions_per_op".
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/icount.sh channel|p2p|stream|channel-stream|rma-put|rma-fop|rma-lock [OPS]" >&2; exit 2; }
layer=${1:-}
ops=${2:-100000}
case "$layer" in
    channel) fn=nemesis_icount_channel_op ;;
    p2p) fn=nemesis_icount_p2p_op ;;
    stream) fn=nemesis_icount_stream_window; ops=$(( (ops + 63) / 64 * 64 )) ;;
    channel-stream) fn=nemesis_icount_channel_window; ops=$(( (ops + 63) / 64 * 64 )) ;;
    rma-put) fn=nemesis_icount_rma_put ;;
    rma-fop) fn=nemesis_icount_rma_fop ;;
    rma-lock) fn=nemesis_icount_rma_lock ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
esac
[[ "$ops" =~ ^[1-9][0-9]*$ ]] || usage
command -v valgrind >/dev/null || { echo "icount: valgrind is not installed (apt-get install -y valgrind)" >&2; exit 1; }

cargo build --release --quiet --example icount
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --toggle-collect="$fn" --callgrind-out-file="$out/cg.out" \
    target/release/examples/icount "$layer" "$ops" >"$out/stdout" 2>"$out/stderr" || {
    cat "$out/stderr" >&2
    exit 1
}
total=$(awk '/^(summary|totals):/ { t = $2 } END { print t }' "$out/cg.out")
[ -n "$total" ] || { echo "icount: no totals in the callgrind output" >&2; exit 1; }
per=$(awk -v t="$total" -v n="$ops" 'BEGIN { printf "%.1f", t / n }')
echo "$layer: $total instructions in $ops operations"
printf '{"bench":"icount","layer":"%s","ops":%s,"instructions":%s,"instructions_per_op":%s}\n' \
    "$layer" "$ops" "$total" "$per"

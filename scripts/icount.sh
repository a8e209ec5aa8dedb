#!/usr/bin/env bash
# Counts the instructions of one 8-byte send plus its receive, with the message already
# arrived, with valgrind's callgrind: a figure that does not move with the machine.
# `stream` counts one message of a window of 64 isends and 64 pre-posted irecvs, each
# side waiting for all of its window (osu_bw's inner loop), per message;
# `channel-stream` the same window of raw packets through the channel; `stream-phases`
# splits `stream`'s window into its four steps (the receiver's irecvs, the sender's
# isends, the sender's waitall, the receiver's waitall with the polls, matches and copies
# it drives), each per message, from a harness of its own. `rma-put` counts
# an 8-byte put into a window member's shared memory and its flush, `rma-fop` an 8-byte
# fetch-and-add there, `rma-lock` an exclusive lock of the member and its unlock.
#
#   scripts/icount.sh channel|p2p|stream|stream-phases|channel-stream|rma-put|rma-fop|rma-lock [OPS]
#
# The last line is a JSON object with "instructions_per_op". The counts read ahead in the
# ring of fastboxes (`NEMESIS_FBOX_READ_AHEAD=1`, the default on Intel CPUs) unless the
# variable says otherwise, so that they do not move with the CPU valgrind reports.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/icount.sh channel|p2p|stream|stream-phases|channel-stream|rma-put|rma-fop|rma-lock [OPS]" >&2; exit 2; }
layer=${1:-}
ops=${2:-100000}
example=icount
case "$layer" in
    channel) fn=nemesis_icount_channel_op ;;
    p2p) fn=nemesis_icount_p2p_op ;;
    stream) fn=nemesis_icount_stream_window; ops=$(( (ops + 63) / 64 * 64 )) ;;
    stream-phases) fn=nemesis_icount_stream_phases; example=icount_phases; ops=$(( (ops + 63) / 64 * 64 )) ;;
    channel-stream) fn=nemesis_icount_channel_window; ops=$(( (ops + 63) / 64 * 64 )) ;;
    rma-put) fn=nemesis_icount_rma_put ;;
    rma-fop) fn=nemesis_icount_rma_fop ;;
    rma-lock) fn=nemesis_icount_rma_lock ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
esac
[[ "$ops" =~ ^[1-9][0-9]*$ ]] || usage
command -v valgrind >/dev/null || { echo "icount: valgrind is not installed (apt-get install -y valgrind)" >&2; exit 1; }

cargo build --release --quiet --example "$example"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=("$layer" "$ops")
[ "$example" = icount ] || args=("$ops")
NEMESIS_FBOX_READ_AHEAD=${NEMESIS_FBOX_READ_AHEAD:-1} valgrind --tool=callgrind --toggle-collect="$fn" --callgrind-out-file="$out/cg.out" \
    "target/release/examples/$example" "${args[@]}" >"$out/stdout" 2>"$out/stderr" || {
    cat "$out/stderr" >&2
    exit 1
}
total=$(awk '/^(summary|totals):/ { t = $2 } END { print t }' "$out/cg.out")
[ -n "$total" ] || { echo "icount: no totals in the callgrind output" >&2; exit 1; }
per=$(awk -v t="$total" -v n="$ops" 'BEGIN { printf "%.1f", t / n }')
echo "$layer: $total instructions in $ops operations"
if [ "$layer" = stream-phases ]; then
    # Each step's count with what it calls: the line of the step's own file.
    callgrind_annotate --inclusive=yes "$out/cg.out" >"$out/annotated" 2>/dev/null || {
        echo "icount: callgrind_annotate failed" >&2
        exit 1
    }
    json=""
    for step in irecvs isends send_waitall recv_waitall; do
        n=$(awk -v f="examples/icount_phases.rs:nemesis_icount_stream_$step" \
            '$0 ~ f" " || $0 ~ f"$" { gsub(",", "", $1); print $1; exit }' "$out/annotated")
        [ -n "$n" ] || { echo "icount: no count for step $step" >&2; exit 1; }
        p=$(awk -v t="$n" -v m="$ops" 'BEGIN { printf "%.1f", t / m }')
        echo "  $step: $p per message"
        json="$json,\"$step\":$p"
    done
    printf '{"bench":"icount","layer":"%s","ops":%s,"instructions":%s,"instructions_per_op":%s%s}\n' \
        "$layer" "$ops" "$total" "$per" "$json"
    exit 0
fi
printf '{"bench":"icount","layer":"%s","ops":%s,"instructions":%s,"instructions_per_op":%s}\n' \
    "$layer" "$ops" "$total" "$per"

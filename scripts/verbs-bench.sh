#!/usr/bin/env bash
# nemesis over ud beside perftest's ib_send_lat over UD, interleaved round by round on
# the same verbs device: the 8-byte one-way latency of each (median over a round), and
# their ratio. Runs where a verbs device is; on this project's machines inside the
# Soft-RoCE VM, whose emulated times mean nothing by themselves (their ratios do):
#
#   cargo build --release -p nemesis-tools --features verbs
#   ../shared/tools/rxe-vm/run.sh -- scripts/verbs-bench.sh [ROUNDS] [ITERS]
#
# Prints one line per round and the medians; with JSON=1, one JSON object per round.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
iters=${2:-2000}
bench=target/release/nemesis-bench
dev=${RXE_VM_DEV:-$(ibv_devices | awk 'NR > 2 { print $1; exit }')}
gid=${RXE_VM_GID_INDEX:-0}
[ -x "$bench" ] || { echo "verbs-bench: build $bench with --features verbs first" >&2; exit 1; }
command -v ib_send_lat >/dev/null || { echo "verbs-bench: perftest's ib_send_lat is not installed (apt-get install perftest)" >&2; exit 1; }

perftest() {
    local port=$((18515 + RANDOM % 1000))
    ib_send_lat -d "$dev" -x "$gid" -c UD -s 8 -n "$iters" -F -p "$port" >/dev/null 2>&1 &
    local server=$!
    local out=""
    for _ in $(seq 50); do
        out=$(ib_send_lat -d "$dev" -x "$gid" -c UD -s 8 -n "$iters" -F -p "$port" 127.0.0.1 2>&1) && break
        sleep 0.2
    done
    wait "$server" || true
    # The row: bytes, iterations, min, max, typical (the median), ...
    awk '$1 == 8 && NF >= 5 { print $5 * 1000; exit }' <<<"$out"
}

nemesis() {
    "$bench" --json latency --transport ud --sizes 8 --iters "$iters" --warmup 200 --rounds 1 |
        grep -o '"p50_ns":[0-9.]*' | cut -d: -f2
}

echo "# 8-byte one-way latency over UD on $dev (gid $gid), $iters round trips a round, ns"
echo "# round  nemesis-ud  ib_send_lat-UD  ratio"
ours=() theirs=()
for r in $(seq "$rounds"); do
    if ((r % 2)); then a=$(nemesis); b=$(perftest); else b=$(perftest); a=$(nemesis); fi
    [ -n "$a" ] && [ -n "$b" ] || { echo "verbs-bench: round $r gave no figure (nemesis '$a', perftest '$b')" >&2; exit 1; }
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')
    ours+=("$a") theirs+=("$b")
    if [ "${JSON:-0}" = 1 ]; then
        printf '{"bench":"verbs-latency","round":%d,"size":8,"nemesis_ud_p50_ns":%s,"ib_send_lat_ud_typical_ns":%s,"ratio":%s}\n' "$r" "$a" "$b" "$ratio"
    else
        printf '%7d %11.0f %15.0f %6s\n' "$r" "$a" "$b" "$ratio"
    fi
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ma=$(median "${ours[@]}") mb=$(median "${theirs[@]}")
printf '# medians: nemesis %.0f ns, ib_send_lat %.0f ns, ratio %s\n' "$ma" "$mb" "$(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.2f", a / b }')"

#!/usr/bin/env bash
# The verbs netmods beside perftest on the same verbs device, interleaved round by
# round: the 8-byte one-way latency of ud beside ib_send_lat over UD and of rc beside
# ib_send_lat over RC (medians of a round), and the 4 MiB bandwidth of rc beside
# ib_read_bw and ib_send_bw over RC; each with its ratio. Runs where a verbs device is;
# on this project's machines inside the Soft-RoCE VM, whose emulated times mean nothing
# by themselves (their ratios do):
#
#   cargo build --release -p nemesis-tools --features verbs
#   ../shared/tools/rxe-vm/run.sh -- scripts/verbs-bench.sh [ROUNDS] [ITERS]
#
# With JSON=1, one JSON object per measurement instead of the table.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
iters=${2:-2000}
bench=target/release/nemesis-bench
dev=${RXE_VM_DEV:-$(ibv_devices | awk 'NR > 2 { print $1; exit }')}
gid=${RXE_VM_GID_INDEX:-0}
[ -x "$bench" ] || { echo "verbs-bench: build $bench with --features verbs first" >&2; exit 1; }
command -v ib_send_lat >/dev/null || { echo "verbs-bench: perftest is not installed (apt-get install perftest)" >&2; exit 1; }

# perftest TOOL ARGS...: runs its server and client on this device; prints the client's output.
perftest() {
    local tool=$1
    shift
    local port=$((18515 + RANDOM % 1000))
    "$tool" -d "$dev" -x "$gid" -F -p "$port" "$@" >/dev/null 2>&1 &
    local server=$! out=""
    for _ in $(seq 50); do
        out=$("$tool" -d "$dev" -x "$gid" -F -p "$port" "$@" 127.0.0.1 2>&1) && break
        sleep 0.2
    done
    wait "$server" || true
    printf '%s\n' "$out"
}

# The median one-way latency in ns ("t_typical", in us, is the fifth column).
perftest_lat() { perftest ib_send_lat -c "$1" -s 8 -n "$iters" | awk '$1 == 8 && NF >= 5 { print $5 * 1000; exit }'; }
# Average bandwidth in MB/s (10^6 bytes): perftest reports MiB/s in the fourth column.
perftest_bw() { perftest "$1" -c RC -s 4194304 -n 200 | awk '$1 == 4194304 && NF >= 4 { printf "%.0f\n", $4 * 1.048576; exit }'; }
nemesis_lat() {
    "$bench" --json latency --transport "$1" --sizes 8 --iters "$iters" --warmup 200 --rounds 1 |
        grep -o '"p50_ns":[0-9.]*' | cut -d: -f2
}
nemesis_bw() {
    "$bench" --json bw --transport rc --sizes 4M --iters 8 --warmup 1 --rounds 1 |
        grep -o '"mb_s":[0-9.]*' | cut -d: -f2
}

declare -A mine=() theirs=()
row() {
    local what=$1 a=$2 b=$3 r=$4 unit=$5
    [ -n "$a" ] && [ -n "$b" ] || { echo "verbs-bench: $what, round $r, gave no figure (nemesis '$a', perftest '$b')" >&2; exit 1; }
    mine[$what]+=" $a" theirs[$what]+=" $b"
    local ratio
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')
    if [ "${JSON:-0}" = 1 ]; then
        printf '{"bench":"verbs","what":"%s","round":%d,"nemesis":%s,"perftest":%s,"unit":"%s","ratio":%s}\n' "$what" "$r" "$a" "$b" "$unit" "$ratio"
    else
        printf '%-28s %5d %12.0f %12.0f %6s %s\n' "$what" "$r" "$a" "$b" "$ratio" "$unit"
    fi
}

echo "# verbs netmods beside perftest on $dev (gid $gid); latency: one way, median of $iters round trips"
echo "# what                         round      nemesis     perftest  ratio unit"
for r in $(seq "$rounds"); do
    # Alternate which goes first.
    if ((r % 2)); then
        a=$(nemesis_lat ud); b=$(perftest_lat UD)
        row "ud 8 B vs ib_send_lat UD" "$a" "$b" "$r" ns
        a=$(nemesis_lat rc); b=$(perftest_lat RC)
        row "rc 8 B vs ib_send_lat RC" "$a" "$b" "$r" ns
        a=$(nemesis_bw); b=$(perftest_bw ib_read_bw)
        row "rc 4 MiB vs ib_read_bw" "$a" "$b" "$r" MB/s
        b=$(perftest_bw ib_send_bw)
        row "rc 4 MiB vs ib_send_bw RC" "$a" "$b" "$r" MB/s
    else
        b=$(perftest_lat UD); a=$(nemesis_lat ud)
        row "ud 8 B vs ib_send_lat UD" "$a" "$b" "$r" ns
        b=$(perftest_lat RC); a=$(nemesis_lat rc)
        row "rc 8 B vs ib_send_lat RC" "$a" "$b" "$r" ns
        b=$(perftest_bw ib_read_bw); a=$(nemesis_bw)
        row "rc 4 MiB vs ib_read_bw" "$a" "$b" "$r" MB/s
        b=$(perftest_bw ib_send_bw)
        row "rc 4 MiB vs ib_send_bw RC" "$a" "$b" "$r" MB/s
    fi
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "# medians"
for what in "ud 8 B vs ib_send_lat UD" "rc 8 B vs ib_send_lat RC" "rc 4 MiB vs ib_read_bw" "rc 4 MiB vs ib_send_bw RC"; do
    a=$(median "${mine[$what]}") b=$(median "${theirs[$what]}")
    printf '# %-26s nemesis %.0f, perftest %.0f, ratio %s\n' "$what" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
done

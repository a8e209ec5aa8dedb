#!/usr/bin/env bash
# One hop of a token ring between "nodes" that are UTS namespaces of this machine (each
# with its own host name, so nemesis counts separate nodes), next to the same ring with
# every rank on a node of its own, interleaved round by round. It shows what crossing
# the network costs a rank that also has local peers.
#
#   scripts/hops.sh [ROUNDS] [LAPS]      (defaults 3 and 300)
#
# Needs root (unshare -u) and target/release/{nemesis-run,examples/ring}. Prints one
# JSON object per measurement: "layout" is "2 per node" (4 ranks as 2 nodes of 2) or
# "1 per node" (4 ranks, 4 nodes, NEMESIS_NO_SHM=1).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
laps=${2:-300}
[[ "$rounds" =~ ^[1-9][0-9]*$ && "$laps" =~ ^[1-9][0-9]*$ ]] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
run=target/release/nemesis-run
ring=target/release/examples/ring
[ -x "$run" ] && [ -x "$ring" ] || { echo "hops.sh: build first: cargo build --release --bins --examples" >&2; exit 1; }
hop() {
    local per=$1; shift
    env NEMESIS_NET_ADDR=127.0.0.1 "$@" timeout 300 "$run" -n 4 bash -c \
        "exec unshare -u bash -c \"hostname h\\\$((PMI_RANK/$per)) && exec $ring $laps\"" |
        sed -n 's/.* \([0-9]*\) ns per hop/\1/p'
}
for r in $(seq 1 "$rounds"); do
    a=$(hop 2)
    b=$(hop 1 NEMESIS_NO_SHM=1)
    printf '{"bench":"hops","round":%d,"layout":"2 per node","ns_per_hop":%s}\n' "$r" "$a"
    printf '{"bench":"hops","round":%d,"layout":"1 per node","ns_per_hop":%s}\n' "$r" "$b"
done

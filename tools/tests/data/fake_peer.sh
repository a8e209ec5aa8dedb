#!/bin/sh
# A stand-in for scripts/peers/osu_peer.c in the tests of `nemesis-bench peers`: it prints
# what osu_peer prints, with fixed figures, so the comparison can be checked without MPI.
#   fake_peer.sh [--procs N] lat|bw|rate|coll SIZES A B
procs=2
if [ "$1" = "--procs" ]; then procs=$2; shift 2; fi
mode=$1 sizes=$2
case "$mode" in
    coll)
        echo "{\"bench\":\"coll\",\"collective\":\"barrier\",\"size\":$procs,\"ns\":1000.0}"
        echo "{\"bench\":\"coll\",\"collective\":\"allreduce\",\"size\":$procs,\"ns\":2000.0}"
        exit 0 ;;
esac
for s in $(echo "$sizes" | tr ',' ' '); do
    case "$mode" in
        lat) echo "{\"bench\":\"latency\",\"size\":$s,\"p50_ns\":100.0,\"samples\":1}" ;;
        bw) echo "{\"bench\":\"bw\",\"size\":$s,\"mb_s\":1000.0,\"window\":64}" ;;
        rate) echo "{\"bench\":\"msgrate\",\"size\":$s,\"msgs_per_s\":1000000.0,\"window\":64}" ;;
        *) echo "fake_peer: unknown mode $mode" >&2; exit 2 ;;
    esac
done

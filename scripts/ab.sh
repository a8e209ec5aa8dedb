#!/usr/bin/env bash
# Two builds or settings of nemesis-bench side by side: A, this work tree's release
# build, and B, the same tree built with extra `--cfg` flags, another git revision, or
# A's binary run with extra environment variables. Each turn runs
# every benchmark with both, the order swapped from turn to turn, so that placement and
# the machine's load fall on both alike. Prints, for each figure and placement, the
# median of each build and B/A.
#
#   scripts/ab.sh [--turns N] (--b-cfg NAME[,NAME...] | --b-rev REV | --b-env VAR=VALUE[,...])
#                 -- ARGS [-- ARGS ...]
#
# Each ARGS is a nemesis-bench command line (`msgrate --sizes 8,64`); `--json` is added.
# The figures: latency p50_ns and its ratio to the probe, msgrate msgs_per_s (and beside
# p2p the channel's and the ratio of the two), bw mb_s, coll median_ns; lower is better
# for the times, higher for the rates. With --b-cfg, B is built into target/ab/cfg-...
# with RUSTFLAGS="--cfg NAME ..." (the switches are in Cargo.toml's check-cfg list);
# with --b-rev, from a git worktree of REV under target/ab/; with --b-env, B is A's
# binary with those NEMESIS_* variables set. --turns defaults to 16.
# The raw rows go to target/ab/last.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: scripts/ab.sh [--turns N] (--b-cfg NAME[,...] | --b-rev REV | --b-env VAR=VALUE[,...]) -- ARGS [-- ARGS ...]" >&2
    exit 2
}
turns=16
bcfg=""
brev=""
benv=""
while [ $# -gt 0 ]; do
    case "$1" in
        --turns) [ $# -ge 2 ] || usage; turns=$2; shift 2 ;;
        --b-cfg) [ $# -ge 2 ] || usage; bcfg=$2; shift 2 ;;
        --b-rev) [ $# -ge 2 ] || usage; brev=$2; shift 2 ;;
        --b-env) [ $# -ge 2 ] || usage; benv=$2; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        *) usage ;;
    esac
done
[[ "$turns" =~ ^[1-9][0-9]*$ ]] || { echo "ab: --turns takes a positive number, not '$turns'" >&2; exit 2; }
given=0
for b in "$bcfg" "$brev" "$benv"; do [ -n "$b" ] && given=$((given + 1)); done
[ "$given" -eq 1 ] || { echo "ab: say what B is with one of --b-cfg, --b-rev and --b-env" >&2; exit 2; }
b_env=()
if [ -n "$benv" ]; then
    IFS=, read -ra pairs <<<"$benv"
    for kv in "${pairs[@]}"; do
        [[ "$kv" =~ ^NEMESIS_[A-Z0-9_]+=[^[:space:]]*$ ]] || {
            echo "ab: '$kv' is not NEMESIS_NAME=VALUE" >&2
            exit 2
        }
        b_env+=("$kv")
    done
fi
[ $# -gt 0 ] || { echo "ab: no benchmark to run (ARGS after --)" >&2; exit 2; }

# The benchmark command lines, split at each further `--`.
cmds=()
cur=""
for a in "$@"; do
    if [ "$a" = "--" ]; then
        [ -n "$cur" ] && cmds+=("$cur")
        cur=""
    else
        case "$a" in *[[:space:]]*) echo "ab: an argument with a space: '$a'" >&2; exit 2 ;; esac
        cur="$cur $a"
    fi
done
[ -n "$cur" ] && cmds+=("$cur")
[ ${#cmds[@]} -gt 0 ] || { echo "ab: no benchmark to run (ARGS after --)" >&2; exit 2; }

mkdir -p target/ab
echo "ab: building A (this work tree)" >&2
cargo build --release --quiet --bin nemesis-bench
a_bin=target/ab/a-nemesis-bench
cp target/release/nemesis-bench "$a_bin"
if [ -n "$benv" ]; then
    b_bin=$a_bin
elif [ -n "$bcfg" ]; then
    flags=""
    name=cfg
    IFS=, read -ra names <<<"$bcfg"
    for n in "${names[@]}"; do
        [[ "$n" =~ ^nemesis_no_[a-z_]+$ ]] || {
            echo "ab: '$n' is not one of the nemesis_no_* switches in Cargo.toml" >&2
            exit 2
        }
        grep -q "\"cfg($n)\"" Cargo.toml || {
            echo "ab: no switch '$n' in Cargo.toml's check-cfg list" >&2
            exit 2
        }
        flags="$flags --cfg $n"
        name="$name-$n"
    done
    echo "ab: building B with$flags" >&2
    RUSTFLAGS="${RUSTFLAGS:-}$flags" cargo build --release --quiet --bin nemesis-bench \
        --target-dir "target/ab/$name"
    b_bin="target/ab/$name/release/nemesis-bench"
else
    sha=$(git rev-parse --verify --quiet "$brev^{commit}") || {
        echo "ab: no commit '$brev'" >&2
        exit 2
    }
    tree="$PWD/target/ab/rev-$sha"
    if [ ! -d "$tree" ]; then
        git worktree add --quiet --detach "$tree" "$sha"
    fi
    echo "ab: building B at ${sha:0:12} in $tree (kept for the next run; git worktree remove --force drops it)" >&2
    (cd "$tree" && cargo build --release --quiet --bin nemesis-bench)
    b_bin="$tree/target/release/nemesis-bench"
fi

rows=target/ab/last.jsonl
: >"$rows"
for t in $(seq 1 "$turns"); do
    order=(A B)
    [ $((t % 2)) -eq 0 ] && order=(B A)
    for c in "${cmds[@]}"; do
        for v in "${order[@]}"; do
            bin=$a_bin
            envs=()
            if [ "$v" = B ]; then
                bin=$b_bin
                envs=("${b_env[@]}")
            fi
            # shellcheck disable=SC2086 # the command line is split on purpose
            if ! out=$(env "${envs[@]}" "$bin" --json $c 2>target/ab/stderr); then
                cat target/ab/stderr >&2
                echo "ab: build $v failed on: nemesis-bench --json$c" >&2
                exit 1
            fi
            printf '%s\n' "$out" | sed -n "s/^{/{\"ab\":\"$v\",\"turn\":$t,/p" >>"$rows"
        done
    done
    echo "ab: turn $t/$turns" >&2
done

# One entry per figure of each row: its key, placement and value.
awk '
function field(name,   m) {
    if (match($0, "\"" name "\":\"[^\"]*\"")) {
        m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:"/, "", m); sub(/"$/, "", m); return m
    }
    if (match($0, "\"" name "\":[-0-9.eE+]+")) {
        m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", m); return m
    }
    return ""
}
function median(list,   n, a, i, j, x) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
    v = field("ab"); pl = field("placement"); if (pl == "") pl = "-"
    key = field("bench")
    for (i = 1; i <= 6; i++) {
        f = (i == 1 ? "layer" : i == 2 ? "collective" : i == 3 ? "path" : i == 4 ? "lmt" : i == 5 ? "recv_buffers" : "transport")
        x = field(f); if (x != "") key = key "/" x
    }
    x = field("procs"); if (x != "") key = key " procs " x
    key = key " " field("size") " B"
    nm = split("p50_ns ratio msgs_per_s channel_msgs_per_s channel_ratio mb_s median_ns", ms, " ")
    for (i = 1; i <= nm; i++) {
        # The ratio to the probe, of latency rows only (bw rows have one to memcpy).
        if (ms[i] == "ratio" && key !~ /^latency/) continue
        x = field(ms[i]); if (x == "") continue
        f = key " " ms[i]
        if (!(f in seen)) { seen[f] = 1; order[++n] = f }
        val[f, pl, v] = val[f, pl, v] " " x; cnt[f, pl, v]++
    }
}
END {
    printf "%-52s %-5s %4s %12s %4s %12s %7s\n", "figure", "place", "n A", "median A", "n B", "median B", "B/A"
    split("near far -", places, " ")
    for (i = 1; i <= n; i++) {
        f = order[i]
        for (j = 1; j <= 3; j++) {
            pl = places[j]
            if (!cnt[f, pl, "A"] && !cnt[f, pl, "B"]) continue
            ma = cnt[f, pl, "A"] ? median(val[f, pl, "A"]) : 0
            mb = cnt[f, pl, "B"] ? median(val[f, pl, "B"]) : 0
            printf "%-52s %-5s %4d %12.3f %4d %12.3f %7s\n", f, pl, cnt[f, pl, "A"], ma, cnt[f, pl, "B"], mb, (ma > 0 && cnt[f, pl, "B"]) ? sprintf("%.3f", mb / ma) : "-"
        }
    }
}' "$rows"

#!/usr/bin/env bash
# Runs a command in a private network namespace whose loopback loses and duplicates udp
# datagrams, for measuring the udp netmod on an impaired link:
#
#   scripts/lossy.sh [--loss PERCENT] [--dup PERCENT] -- COMMAND [ARGS...]
#
#   scripts/lossy.sh --loss 5 --dup 1 -- target/release/nemesis-bench bw --transport udp
#
# Loss and duplication (defaults 5 and 1) apply to every udp datagram, both ways, by
# nftables rules on the namespace's loopback; tcp is untouched, so a plain TCP reference
# measured in the same run stays clean. Needs root (ip netns, nft). The namespace is
# removed when the command ends; the counts of what was dropped and duplicated are
# printed to standard error.
set -euo pipefail

loss=5 dup=1
while [ $# -gt 0 ]; do
    case "$1" in
        --loss) loss=$2; shift 2 ;;
        --dup) dup=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "lossy.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "lossy.sh: no command (see --help)" >&2; exit 2; }
for v in "$loss" "$dup"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -le 100 ] || { echo "lossy.sh: percentages are whole numbers 0 to 100" >&2; exit 2; }
done
for tool in ip nft; do
    command -v "$tool" >/dev/null || { echo "lossy.sh: $tool is not installed" >&2; exit 1; }
done

ns="nemesis-lossy-$$"
ip netns add "$ns"
trap 'ip netns exec "$ns" nft list table netdev lossy 2>/dev/null | grep -o "counter packets [0-9]* .*" >&2 || true; ip netns del "$ns"' EXIT
ip -n "$ns" link set lo up
# Drops on ingress; copies on egress, so each copy is received as a datagram of its own.
ip netns exec "$ns" nft -f - <<RULES
table netdev lossy {
  chain lose { type filter hook ingress device "lo" priority 0; meta l4proto udp numgen random mod 100 < $loss counter drop; }
  chain twice { type filter hook egress device "lo" priority 0; meta l4proto udp numgen random mod 100 < $dup counter dup to "lo"; }
}
RULES
ip netns exec "$ns" "$@"

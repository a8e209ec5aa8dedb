#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests that run nemesis under
# `srun --mpi=pmi2`: this host is the controller and the only compute node.
#
#   scripts/slurm.sh start    installs Slurm and munge when missing (apt-get, as root),
#                             writes a configuration under target/slurm and starts
#                             munged, slurmctld and slurmd; prints `export SLURM_CONF=...`
#   scripts/slurm.sh stop     stops the daemons it started
#   scripts/slurm.sh env      prints the `export SLURM_CONF=...` line
#
# Needs root, Debian's packages and nothing else: no systemd, no network beyond
# loopback. The node declares the machine's real CPU count, so a job with more tasks
# than CPUs needs `--overcommit`, as on a real cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=$PWD/target/slurm
conf=$dir/slurm.conf

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

install() {
    local missing=()
    for cmd in slurmctld slurmd srun munged; do
        command -v "$cmd" >/dev/null || missing+=("$cmd")
    done
    ((${#missing[@]})) || return 0
    echo "slurm.sh: installing Slurm and munge (missing: ${missing[*]})" >&2
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get -o DPkg::Lock::Timeout=900 update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=900 install -y -qq \
        --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

write_conf() {
    local host cpus
    host=$(hostname -s)
    cpus=$(nproc)
    mkdir -p "$dir/ctld" "$dir/d" "$dir/log"
    cat >"$conf" <<CONF
# Written by scripts/slurm.sh: a one-node cluster for the nemesis tests.
ClusterName=nemesis-test
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmi2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
CONF
}

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && ! ps -o stat= -p "$(cat "$1")" | grep -q Z; }

start() {
    install
    if [ "$(id -u)" -ne 0 ]; then
        echo "slurm.sh: the daemons run as root; run this as root" >&2
        exit 1
    fi
    write_conf
    export SLURM_CONF=$conf
    mkdir -p /run/munge && chown munge:munge /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey --create >/dev/null 2>&1 || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged
    fi
    munge -n | unmunge >/dev/null
    # A fresh cluster every time: no job or node state from an earlier run.
    stop
    for port in 16817 16818; do
        if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
            echo "slurm.sh: port $port is taken (another cluster of this kind? scripts/slurm.sh stop in its checkout)" >&2
            exit 1
        fi
    done
    rm -rf "${dir:?}/ctld/"* "${dir:?}/d/"*
    slurmctld -f "$conf"
    slurmd -f "$conf"
    for _ in $(seq 1 100); do
        case "$(sinfo -h -N -o %T 2>/dev/null || true)" in idle*|mixed*|alloc*) break ;; esac
        # A node left down by an earlier run comes back at once.
        scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
        sleep 0.2
    done
    case "$(sinfo -h -N -o %T 2>/dev/null || true)" in
        idle*|mixed*|alloc*) ;;
        *) echo "slurm.sh: the node did not come up; see $dir/log" >&2; exit 1 ;;
    esac
    echo "export SLURM_CONF=$conf"
}

stop() {
    for f in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
        running "$f" || continue
        kill "$(cat "$f")" 2>/dev/null || true
        for _ in $(seq 1 50); do running "$f" || break; sleep 0.1; done
        if running "$f"; then kill -9 "$(cat "$f")" 2>/dev/null || true; fi
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$conf" ;;
    -h|--help) usage 0 ;;
    *) usage ;;
esac

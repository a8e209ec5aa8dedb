#!/usr/bin/env bash
# Two-sided nemesis beside the MPI implementations on this machine, interleaved round by
# round in one run (`nemesis-bench peers`): ping-pong latency, osu_bw bandwidth with one
# receive buffer, and message rate, with nemesis/peer ratios as a table or JSON lines.
#
#   scripts/peers.sh [--build-mpich-nemesis] [--tcp] [--json] [-- NEMESIS-BENCH-PEERS-OPTIONS]
#
# --tcp compares over loopback TCP instead of shared memory: nemesis's tcp netmod with
# shared memory off, MPICH ch3:nemesis's tcp netmod (MPIR_CVAR_NOLOCAL=1), UCX's tcp
# transport (UCX_TLS=tcp,self) and Open MPI's tcp BTL.
#
# Peers, each used when present:
#   Debian's MPICH      mpicc.mpich / mpiexec.mpich (named by its device: mpich-ch4-ucx)
#   Open MPI            mpicc.openmpi / mpiexec.openmpi, with the vader shared-memory BTL;
#                       also barrier and allreduce among 4 and 8 ranks on these CPUs,
#                       against nemesis's through messages
#   MPICH ch3:nemesis   4.0.2 from the Debian source package, built into
#                       target/peers/mpich-nemesis by --build-mpich-nemesis (once; it is
#                       kept, and used from then on; about 10 minutes on 2 CPUs)
# The peers run scripts/peers/osu_peer.c, built with each one's mpicc. Options after `--`
# go to `nemesis-bench peers` (see its --help), for example `-- --rounds 9 --bw-sizes 64K`.
set -euo pipefail
cd "$(dirname "$0")/.."

build_ch3=0
tcp=0
json=()
while [ $# -gt 0 ]; do
    case "$1" in
        --build-mpich-nemesis) build_ch3=1 ;;
        --json) json=(--json) ;;
        --tcp) tcp=1 ;;
        -h|--help) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        *) echo "peers: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

out=target/peers
mkdir -p "$out"
ch3="$PWD/$out/mpich-nemesis"

# MPICH 4.0.2 with the ch3:nemesis device, from the Debian source package, fetched
# through a private source list so that the system's apt configuration is not touched.
build_mpich_nemesis() {
    local src="$PWD/$out/src" apt="$PWD/$out/aptsrc"
    mkdir -p "$src" "$apt/lists/partial"
    echo "deb-src http://deb.debian.org/debian bookworm main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$apt/lists" -o DPkg::Lock::Timeout=900)
    echo "peers: fetching the MPICH source package" >&2
    apt-get "${opts[@]}" -qq update
    (cd "$src" && apt-get "${opts[@]}" -qq source --download-only mpich)
    local tarball
    tarball=$(ls "$src"/mpich_*.orig.tar.* | head -n1)
    tar -C "$src" -xf "$tarball"
    local dir
    dir=$(ls -d "$src"/mpich-*/ | head -n1)
    echo "peers: building MPICH ch3:nemesis in $dir (progress in $out/mpich-build.log)" >&2
    (
        cd "$dir"
        ./configure --prefix="$ch3" --with-device=ch3:nemesis --with-pm=hydra \
            --disable-fortran --disable-cxx --disable-romio --without-yaksa \
            --enable-fast=O3,ndebug --enable-g=none --with-hwloc=embedded
        make -j"$(nproc)"
        make install
    ) >"$out/mpich-build.log" 2>&1 || {
        tail -n 30 "$out/mpich-build.log" >&2
        echo "peers: the MPICH ch3:nemesis build failed; the log is $out/mpich-build.log" >&2
        exit 1
    }
}

if [ "$build_ch3" = 1 ] && [ ! -x "$ch3/bin/mpicc" ]; then
    build_mpich_nemesis
fi

peers=()
add_peer() { # NAME MPICC LAUNCH...
    local name=$1 mpicc=$2
    shift 2
    local bin="$PWD/$out/osu_peer.$name"
    "$mpicc" -O2 -o "$bin" scripts/peers/osu_peer.c
    peers+=(--peer "$name=$* $bin")
}
suffix=""
btl=self,vader
extra=()
if [ "$tcp" = 1 ]; then
    suffix=-tcp
    btl=self,tcp
    extra=(--transport tcp)
fi
if command -v mpicc.mpich >/dev/null && command -v mpiexec.mpich >/dev/null; then
    device=$(mpichversion 2>/dev/null | awk -F'\t' '/Device/ { gsub(/[^a-z0-9]+/, "-", $NF); print $NF }')
    if [ "$tcp" = 1 ]; then
        add_peer "mpich-${device:-debian}$suffix" mpicc.mpich env UCX_TLS=tcp,self mpiexec.mpich -n 2 -bind-to core
    else
        add_peer "mpich-${device:-debian}" mpicc.mpich mpiexec.mpich -n 2 -bind-to core
    fi
fi
if command -v mpicc.openmpi >/dev/null && command -v mpiexec.openmpi >/dev/null; then
    add_peer "openmpi$suffix" mpicc.openmpi mpiexec.openmpi --allow-run-as-root --oversubscribe -n 2 \
        --bind-to core --mca pml ob1 --mca btl "$btl"
    # Barrier and allreduce among more ranks than CPUs: unbound, and told to yield when
    # idle. Open MPI yields by itself only when the ranks outnumber the slots it counts,
    # the machine's cores: where this script runs confined to fewer CPUs (taskset), its
    # ranks would busy-poll, a barrier taking milliseconds. (MPICH's ranks busy-poll
    # there, so they are not asked.)
    peers+=(--peer-coll "openmpi$suffix=mpiexec.openmpi --allow-run-as-root --oversubscribe --bind-to none \
-n {procs} --mca pml ob1 --mca btl $btl --mca mpi_yield_when_idle 1 $PWD/$out/osu_peer.openmpi$suffix")
fi
if [ -x "$ch3/bin/mpicc" ]; then
    if [ "$tcp" = 1 ]; then
        add_peer "mpich-ch3-nemesis$suffix" "$ch3/bin/mpicc" env MPIR_CVAR_NOLOCAL=1 "$ch3/bin/mpiexec" -n 2 -bind-to core
    else
        add_peer mpich-ch3-nemesis "$ch3/bin/mpicc" "$ch3/bin/mpiexec" -n 2 -bind-to core
    fi
fi
if [ ${#peers[@]} -eq 0 ]; then
    echo "peers: no MPI found (apt-get install mpich libmpich-dev, or openmpi-bin libopenmpi-dev;" >&2
    echo "       or --build-mpich-nemesis)" >&2
    exit 1
fi

cargo build --release --quiet --bin nemesis-bench
exec target/release/nemesis-bench "${json[@]}" peers "${extra[@]}" "${peers[@]}" "$@"

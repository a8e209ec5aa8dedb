//! Checks of the one-sided layer between processes, after the checks of MPICH's
//! `test/mpi/rma` programs (written here anew): each returns what went wrong, and the
//! same checks run over shared memory, over each netmod, and across hosts.

use nemesis::rma::{AccOp, Assert, Executor, Flavor, LockKind, Strided, Window};
use nemesis::{Op, World};

type R = Result<(), String>;

/// A named check.
type Check<'a> = (&'static str, &'a dyn Fn(&mut World) -> R);

fn e(what: &'static str) -> impl Fn(nemesis::rma::RmaError) -> String {
    move |e| format!("{what}: {e}")
}

fn p(what: &'static str) -> impl Fn(nemesis::P2pError) -> String {
    move |e| format!("{what}: {e}")
}

/// Reads `out.len()` elements of rank `t` at `at`, in a shared lock epoch of its own.
fn read_back(w: &mut World, win: &Window<u64>, t: u32, at: usize, out: &mut [u64]) -> R {
    let mut ep = win.lock(w, t, LockKind::Shared).map_err(e("lock"))?;
    ep.read(out, t, at).map_err(e("read"))?;
    ep.unlock().map_err(e("unlock"))
}

/// Who runs the windows' atomics: the card with `RMA_EXECUTOR=nic`, else the CPU.
pub fn executor() -> Executor {
    match std::env::var("RMA_EXECUTOR").as_deref() {
        Ok("nic") => Executor::Nic,
        _ => Executor::Cpu,
    }
}

/// A window of `len` u64 per rank in `flavor`, and each rank's base displacement.
pub fn window(w: &mut World, flavor: Flavor, len: usize) -> Result<(Window<u64>, Vec<usize>), String> {
    let comm = w.comm();
    let win = match flavor {
        Flavor::Allocate => Window::allocate_with(w, &comm, len, executor()),
        Flavor::Create => Window::create_with(w, &comm, vec![0u64; len], executor()),
        Flavor::Dynamic => Window::dynamic(w, &comm),
    }
    .map_err(e("making a window"))?;
    let mut base = vec![0u64; comm.size() as usize];
    if flavor == Flavor::Dynamic {
        let r = win.attach(w, vec![0u64; len]).map_err(e("attach"))?;
        w.allgather(&comm, &[r.disp() as u64], &mut base)
            .map_err(p("allgather"))?;
    }
    Ok((win, base.into_iter().map(|b| b as usize).collect()))
}

/// `fetchandadd`: every rank adds 1 to rank 0's counter many times; every value it
/// fetched is handed out once.
pub fn fetch_and_add(w: &mut World, flavor: Flavor) -> R {
    const EACH: u64 = 200;
    let comm = w.comm();
    let n = u64::from(w.size());
    let (win, base) = window(w, flavor, 1)?;
    let mut got = Vec::with_capacity(EACH as usize);
    let mut ep = win.lock_all(w).map_err(e("lock_all"))?;
    for _ in 0..EACH {
        got.push(
            ep.fetch_and_op(1, 0, base[0], AccOp::Sum)
                .map_err(e("fetch_and_op"))?,
        );
    }
    ep.unlock().map_err(e("unlock"))?;
    let mut all = vec![0u64; (EACH * n) as usize];
    w.allgather(&comm, &got, &mut all).map_err(p("allgather"))?;
    all.sort_unstable();
    if all != (0..EACH * n).collect::<Vec<_>>() {
        return Err("a fetched value was handed out twice".into());
    }
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `atomic_rmw_fop`, `atomic_rmw_cas`, `atomic_rmw_gacc`: ranks that map rank 0's
/// memory and ranks that reach it by messages update one word together; no fetched
/// value collides and no update is lost.
pub fn atomic_rmw(w: &mut World) -> R {
    const EACH: u64 = 100;
    let comm = w.comm();
    let n = u64::from(w.size());
    let win = Window::<u64>::allocate_with(w, &comm, 3, executor()).map_err(e("allocate"))?;
    let (mut fop, mut wins) = (Vec::new(), 0u64);
    let mut olds = vec![[0u64; 2]; EACH as usize];
    {
        let mut ep = win.lock_all(w).map_err(e("lock_all"))?;
        for _ in 0..EACH {
            fop.push(ep.fetch_and_op(1, 0, 0, AccOp::Sum).map_err(e("fetch_and_op"))?);
            // A compare-and-swap increment: count the ones that took.
            let seen = ep.fetch_and_op(0, 0, 1, AccOp::NoOp).map_err(e("no-op"))?;
            if ep.compare_and_swap(seen, seen + 1, 0, 1).map_err(e("cas"))? == seen {
                wins += 1;
            }
        }
        ep.unlock().map_err(e("unlock"))?;
        let mut ep = win.lock_all(w).map_err(e("lock_all"))?;
        for old in olds.iter_mut() {
            ep.get_accumulate(&[1, 2], old, 0, 1, AccOp::Sum)
                .map_err(e("get_accumulate"))?;
        }
        ep.unlock().map_err(e("unlock"))?;
    }
    // Each get-accumulate saw the sums of the ones applied before it: strictly growing
    // from one origin, as accumulates from one origin apply in order.
    if olds.windows(2).any(|p| p[1][1] <= p[0][1]) {
        return Err("get-accumulates from one origin saw the word go back".into());
    }
    let mut all = vec![0u64; (EACH * n) as usize];
    w.allgather(&comm, &fop, &mut all).map_err(p("allgather"))?;
    all.sort_unstable();
    if all != (0..EACH * n).collect::<Vec<_>>() {
        return Err("fetch-and-op handed a value out twice".into());
    }
    let mut total = [wins];
    w.allreduce(&comm, &mut total, Op::Sum).map_err(p("allreduce"))?;
    let mut v = [0u64; 3];
    read_back(w, &win, 0, 0, &mut v)?;
    if v != [EACH * n, total[0] + EACH * n, 2 * EACH * n] {
        return Err(format!(
            "after the updates rank 0 holds {v:?}, expected [{}, {}, {}]",
            EACH * n,
            total[0] + EACH * n,
            2 * EACH * n
        ));
    }
    w.barrier(&comm).map_err(p("barrier"))?;
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `acc_ordering`: replaces from one origin to one location, each read back by a
/// get-accumulate, apply in the order they were issued.
pub fn acc_ordering(w: &mut World, flavor: Flavor) -> R {
    let (me, n) = (w.rank(), w.size());
    let (win, base) = window(w, flavor, 1)?;
    let t = (me + 1) % n;
    let mut ep = win.lock(w, t, LockKind::Exclusive).map_err(e("lock"))?;
    for i in 1..=200u64 {
        ep.accumulate(&[i], t, base[t as usize], AccOp::Replace)
            .map_err(e("replace"))?;
        let v = ep
            .fetch_and_op(0, t, base[t as usize], AccOp::NoOp)
            .map_err(e("read"))?;
        if v != i {
            return Err(format!("read {v} after replacing with {i}"));
        }
    }
    ep.unlock().map_err(e("unlock"))?;
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `linked_list_fop`: every rank appends nodes of its own memory (a dynamic window) to
/// one list by swapping the tail pointer at rank 0 and linking the old tail to its node;
/// rank 0 then walks the whole list.
pub fn linked_list(w: &mut World) -> R {
    const EACH: usize = 20;
    let comm = w.comm();
    let (me, n) = (w.rank(), w.size());
    // A node is two words: its value and a pointer to the next (0 for none).
    let ptr = |rank: u32, disp: usize| (u64::from(rank) + 1) << 48 | disp as u64;
    let list = Window::<u64>::dynamic(w, &comm).map_err(e("dynamic"))?;
    let mut mem = vec![0u64; 2 * EACH + 2];
    for i in 0..EACH {
        mem[2 * i] = u64::from(me) * 1000 + i as u64;
    }
    mem[2 * EACH] = u64::MAX; // rank 0's head sentinel
    let region = list.attach(w, mem).map_err(e("attach"))?;
    let mut disps = vec![0u64; n as usize];
    w.allgather(&comm, &[region.disp() as u64], &mut disps)
        .map_err(p("allgather"))?;
    let tail = Window::<u64>::allocate(w, &comm, 1).map_err(e("allocate"))?;
    let head = ptr(0, disps[0] as usize + 2 * EACH);
    if me == 0 {
        tail.local_atomics().expect("allocated")[0].store(head, std::sync::atomic::Ordering::Release);
    }
    w.barrier(&comm).map_err(p("barrier"))?;
    for i in 0..EACH {
        let node = ptr(me, disps[me as usize] as usize + 2 * i);
        let prev = {
            let mut ep = tail.lock(w, 0, LockKind::Shared).map_err(e("lock tail"))?;
            let prev = ep
                .fetch_and_op(node, 0, 0, AccOp::Replace)
                .map_err(e("swap tail"))?;
            ep.unlock().map_err(e("unlock tail"))?;
            prev
        };
        let (owner, disp) = ((prev >> 48) as u32 - 1, (prev & ((1 << 48) - 1)) as usize);
        let mut ep = list.lock(w, owner, LockKind::Shared).map_err(e("lock list"))?;
        ep.accumulate(&[node], owner, disp + 1, AccOp::Replace)
            .map_err(e("link"))?;
        ep.unlock().map_err(e("unlock list"))?;
    }
    w.barrier(&comm).map_err(p("barrier"))?;
    if me == 0 {
        let mut at = head;
        let mut seen = Vec::new();
        let mut ep = list.lock_all(w).map_err(e("lock_all"))?;
        while at != 0 {
            let (owner, disp) = ((at >> 48) as u32 - 1, (at & ((1 << 48) - 1)) as usize);
            let mut node = [0u64; 2];
            ep.read(&mut node, owner, disp).map_err(e("walk"))?;
            seen.push(node[0]);
            at = node[1];
        }
        ep.unlock().map_err(e("unlock"))?;
        seen.remove(0);
        seen.sort_unstable();
        let want: Vec<u64> = (0..u64::from(n))
            .flat_map(|r| (0..EACH as u64).map(move |i| r * 1000 + i))
            .collect();
        if seen != want {
            return Err(format!(
                "the list holds {} nodes, {} expected",
                seen.len(),
                want.len()
            ));
        }
    }
    w.barrier(&comm).map_err(p("barrier"))?;
    list.detach(w, region).map_err(e("detach"))?;
    tail.free(w).map_err(e("free"))?;
    Ok(())
}

/// `mutex_bench`: a mutex made of compare-and-swap on rank 0's word guards a counter
/// that is read and written with plain gets and puts.
pub fn mutex(w: &mut World, flavor: Flavor) -> R {
    const EACH: u64 = 30;
    let comm = w.comm();
    let (me, n) = (w.rank(), w.size());
    let (win, base) = window(w, flavor, 2)?;
    let (m, c) = (base[0], base[0] + 1);
    let mut ep = win.lock_all(w).map_err(e("lock_all"))?;
    for _ in 0..EACH {
        while ep
            .compare_and_swap(0, u64::from(me) + 1, 0, m)
            .map_err(e("acquire"))?
            != 0
        {
            std::thread::yield_now();
        }
        let mut v = [0u64];
        ep.read(&mut v, 0, c).map_err(e("read"))?;
        ep.put(&[v[0] + 1], 0, c).map_err(e("put"))?;
        ep.flush(0).map_err(e("flush"))?;
        let was = ep.fetch_and_op(0, 0, m, AccOp::Replace).map_err(e("release"))?;
        if was != u64::from(me) + 1 {
            return Err(format!("released a mutex held by {was}"));
        }
    }
    ep.unlock().map_err(e("unlock"))?;
    w.barrier(&comm).map_err(p("barrier"))?;
    let mut v = [0u64];
    read_back(w, &win, 0, c, &mut v)?;
    if v[0] != EACH * u64::from(n) {
        return Err(format!(
            "the guarded counter is {}, expected {}",
            v[0],
            EACH * u64::from(n)
        ));
    }
    w.barrier(&comm).map_err(p("barrier"))?;
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `test1` and `manyrma`: many puts and accumulates to every rank in fence epochs, and
/// gets of what they wrote.
pub fn fences(w: &mut World, flavor: Flavor) -> R {
    let (me, n) = (w.rank(), w.size());
    let len = 64usize;
    let (win, base) = window(w, flavor, len * n as usize)?;
    let mut back = vec![0u64; len];
    for round in 0..5u64 {
        let mut ep = win.fence(w, Assert::NONE).map_err(e("fence"))?;
        for t in 0..n {
            for i in 0..len {
                let v = round * 1_000_000 + u64::from(me) * 1000 + i as u64;
                let at = base[t as usize] + me as usize * len + i;
                if i % 2 == 0 {
                    ep.put(&[v], t, at).map_err(e("put"))?;
                } else {
                    ep.accumulate(&[v], t, at, AccOp::Replace)
                        .map_err(e("accumulate"))?;
                }
            }
        }
        let mut ep = ep.fence(Assert::NONE).map_err(e("fence"))?;
        let t = (me + round as u32) % n;
        ep.get(&mut back, t, base[t as usize] + me as usize * len)
            .map_err(e("get"))?;
        ep.end(Assert::NONE).map_err(e("end"))?;
        for (i, &v) in back.iter().enumerate() {
            let want = round * 1_000_000 + u64::from(me) * 1000 + i as u64;
            if v != want {
                return Err(format!(
                    "round {round}: rank {t} element {i} holds {v}, expected {want}"
                ));
            }
        }
    }
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `test2` and `pscw_ordering`: post, start, complete and wait between neighbours in
/// both directions, epoch after epoch.
pub fn pscw(w: &mut World, flavor: Flavor) -> R {
    let (me, n) = (w.rank(), w.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let (win, base) = window(w, flavor, 2)?;
    let group: Vec<u32> = if left == right {
        vec![left]
    } else {
        vec![left, right]
    };
    for round in 1..=10u64 {
        let exp = win.post(w, &group, Assert::NONE).map_err(e("post"))?;
        let mut acc = win.start(w, &group, Assert::NONE).map_err(e("start"))?;
        acc.accumulate(&[round], right, base[right as usize], AccOp::Sum)
            .map_err(e("to the right"))?;
        acc.accumulate(&[round], left, base[left as usize] + 1, AccOp::Sum)
            .map_err(e("to the left"))?;
        acc.complete().map_err(e("complete"))?;
        exp.wait(w).map_err(e("wait"))?;
        let mut v = [0u64; 2];
        read_back(w, &win, me, base[me as usize], &mut v)?;
        let want = round * (round + 1) / 2;
        let both = if left == right { 2 * want } else { want };
        if v != [want, want] && !(left == right && v == [both, both]) {
            return Err(format!(
                "after epoch {round} this rank holds {v:?}, expected {want} each"
            ));
        }
    }
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `lockcontention3`: exclusive read-modify-writes of two words under the lock, and
/// shared readers that must never see them differ.
pub fn lock_contention(w: &mut World, flavor: Flavor) -> R {
    const EACH: u32 = 40;
    let comm = w.comm();
    let me = w.rank();
    let (win, base) = window(w, flavor, 2)?;
    let at = base[0];
    let mut writes = 0u64;
    for i in 0..EACH {
        if (me + i) % 4 == 0 {
            let mut v = [0u64; 2];
            let mut ep = win.lock(w, 0, LockKind::Shared).map_err(e("lock shared"))?;
            ep.read(&mut v, 0, at).map_err(e("read"))?;
            ep.unlock().map_err(e("unlock"))?;
            if v[0] != v[1] {
                return Err(format!("a shared lock saw half an update: {v:?}"));
            }
        } else {
            writes += 1;
            let mut ep = win.lock(w, 0, LockKind::Exclusive).map_err(e("lock exclusive"))?;
            let mut v = [0u64; 2];
            ep.read(&mut v, 0, at).map_err(e("read"))?;
            ep.put(&[v[0] + 1], 0, at).map_err(e("put"))?;
            ep.flush(0).map_err(e("flush"))?;
            ep.put(&[v[1] + 1], 0, at + 1).map_err(e("put"))?;
            ep.unlock().map_err(e("unlock"))?;
        }
    }
    let mut total = [writes];
    w.allreduce(&comm, &mut total, Op::Sum).map_err(p("allreduce"))?;
    let mut v = [0u64; 2];
    read_back(w, &win, 0, at, &mut v)?;
    if v != [total[0], total[0]] {
        return Err(format!("{v:?} after {} exclusive updates", total[0]));
    }
    w.barrier(&comm).map_err(p("barrier"))?;
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `win_shared_put_flush_get` and `rput_local_comp`/`rget`: a put, a flush, and a
/// request-based get in the same epoch see each other.
pub fn put_flush_get(w: &mut World, flavor: Flavor) -> R {
    let (me, n) = (w.rank(), w.size());
    let (win, base) = window(w, flavor, 4096)?;
    let t = (me + 1) % n;
    let data: Vec<u64> = (0..4096).map(|i| i * 7 + u64::from(me)).collect();
    let mut back = vec![0u64; 4096];
    let mut ep = win.lock(w, t, LockKind::Exclusive).map_err(e("lock"))?;
    let r = ep.rput(&data, t, base[t as usize]).map_err(e("rput"))?;
    if !r.is_complete() || r.len() != 8 * data.len() {
        return Err("an rput not complete at the origin when it returned".into());
    }
    ep.flush(t).map_err(e("flush"))?;
    let g = ep.rget(&mut back, t, base[t as usize]).map_err(e("rget"))?;
    let got = ep.wait(g).map_err(e("wait"))?;
    if got != data.as_slice() {
        return Err("a get after a flushed put did not see it".into());
    }
    ep.unlock().map_err(e("unlock"))?;
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `transpose1`: each rank puts its matrix, transposed with strided blocks, into its
/// right neighbour's window in a fence epoch.
pub fn transpose(w: &mut World, flavor: Flavor) -> R {
    const N: usize = 8;
    let (me, n) = (w.rank(), w.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let (win, base) = window(w, flavor, N * N)?;
    let a: Vec<u64> = (0..(N * N) as u64).map(|i| i + 1000 * u64::from(me)).collect();
    let mut ep = win.fence(w, Assert::NONE).map_err(e("fence"))?;
    for i in 0..N {
        let col = Strided {
            disp: base[right as usize] + i,
            count: N,
            block: 1,
            stride: N,
        };
        ep.put_v(&[&a[i * N..(i + 1) * N]], right, &col.blocks())
            .map_err(e("put_v"))?;
    }
    ep.end(Assert::NONE).map_err(e("fence"))?;
    let mut got = vec![0u64; N * N];
    read_back(w, &win, me, base[me as usize], &mut got)?;
    for r in 0..N {
        for c in 0..N {
            let want = (c * N + r) as u64 + 1000 * u64::from(left);
            if got[r * N + c] != want {
                return Err(format!(
                    "element ({r}, {c}) is {}, expected {want}",
                    got[r * N + c]
                ));
            }
        }
    }
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// `selfrma` and `rmazero`: every operation on this rank's own memory, and operations
/// of no elements, which do nothing and fail nothing.
pub fn self_and_zero(w: &mut World, flavor: Flavor) -> R {
    let me = w.rank();
    let (win, base) = window(w, flavor, 4)?;
    let b = base[me as usize];
    let mut ep = win.lock(w, me, LockKind::Exclusive).map_err(e("lock"))?;
    ep.put(&[1, 2], me, b).map_err(e("put"))?;
    ep.accumulate(&[10, 10], me, b, AccOp::Sum)
        .map_err(e("accumulate"))?;
    let old = ep
        .fetch_and_op(5, me, b + 2, AccOp::Replace)
        .map_err(e("fetch_and_op"))?;
    let cas = ep.compare_and_swap(5, 6, me, b + 2).map_err(e("cas"))?;
    ep.put(&[], me, b + 4).map_err(e("empty put"))?;
    ep.read(&mut [], me, b + 4).map_err(e("empty read"))?;
    ep.accumulate(&[], me, b, AccOp::Sum)
        .map_err(e("empty accumulate"))?;
    let mut v = [0u64; 4];
    ep.read(&mut v, me, b).map_err(e("read"))?;
    ep.unlock().map_err(e("unlock"))?;
    if (old, cas, v) != (0, 5, [11, 12, 6, 0]) {
        return Err(format!("got {old}, {cas}, {v:?}"));
    }
    w.barrier(&w.comm()).map_err(p("barrier"))?;
    win.free(w).map_err(e("free"))?;
    Ok(())
}

/// The child of the one-sided checks in every test binary that runs them: each flavour
/// in turn, the names and times of the checks on rank 0's standard output.
pub fn child() -> R {
    let mut w = nemesis::init().map_err(|e| e.to_string())?;
    suite(&mut w)
}

/// Every check for each flavour `RMA_FLAVORS` names (all three by default; a dynamic
/// window's atomics are never the card's), on `w`.
pub fn suite(w: &mut World) -> R {
    let all = [Flavor::Allocate, Flavor::Create, Flavor::Dynamic];
    let all = &all[..if executor() == Executor::Nic { 2 } else { 3 }];
    let wanted = std::env::var("RMA_FLAVORS").ok();
    for &f in all.iter().filter(|f| {
        wanted.as_deref().is_none_or(|v| {
            v.split(',')
                .any(|s| format!("{f:?}").eq_ignore_ascii_case(s.trim()))
        })
    }) {
        let done = self::all(w, f)?;
        if w.rank() == 0 {
            println!("{f:?}: {}", done.join(" "));
        }
    }
    println!("rma suite done");
    Ok(())
}

/// Every check, in turn, for one flavour; `Err` names the check that failed.
pub fn all(w: &mut World, flavor: Flavor) -> Result<Vec<String>, String> {
    let mut done = Vec::new();
    let checks: [Check<'_>; 10] = [
        ("fetchandadd", &|w| fetch_and_add(w, flavor)),
        ("acc_ordering", &|w| acc_ordering(w, flavor)),
        ("mutex", &|w| mutex(w, flavor)),
        ("fences", &|w| fences(w, flavor)),
        ("pscw", &|w| pscw(w, flavor)),
        ("lockcontention", &|w| lock_contention(w, flavor)),
        ("put_flush_get", &|w| put_flush_get(w, flavor)),
        ("transpose", &|w| transpose(w, flavor)),
        ("selfrma_rmazero", &|w| self_and_zero(w, flavor)),
        ("atomic_rmw", &|w| {
            if flavor == Flavor::Allocate {
                atomic_rmw(w)
            } else {
                Ok(())
            }
        }),
    ];
    for (name, f) in checks {
        let t = std::time::Instant::now();
        f(w).map_err(|e| format!("{name} ({flavor:?}): {e}"))?;
        done.push(format!("{name} ({:.1} s)", t.elapsed().as_secs_f64()));
    }
    if flavor == Flavor::Dynamic {
        let t = std::time::Instant::now();
        linked_list(w).map_err(|e| format!("linked_list: {e}"))?;
        done.push(format!("linked_list ({:.1} s)", t.elapsed().as_secs_f64()));
    }
    Ok(done)
}

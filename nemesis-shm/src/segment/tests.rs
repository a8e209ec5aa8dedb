use super::*;
use crate::port::Port;
use std::fs::OpenOptions;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

fn spec(dir: &Path, nprocs: u32) -> JoinSpec {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let job = 0xfeed_0000_0000 + std::process::id() as u64 * 1000 + N.fetch_add(1, Ordering::Relaxed);
    JoinSpec {
        dir: dir.to_path_buf(),
        name: crate::config::segment_name(job, 0),
        job_id: job,
        node: 0,
        nprocs,
        geometry: Geometry::default(),
        timeout: Duration::from_secs(10),
    }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nemesis-shm-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn join_unlinks_and_sets_mode_0600() {
    let dir = tmpdir("join");
    let s = spec(&dir, 2);
    let s2 = s.clone();
    let other = std::thread::spawn(move || Segment::join(&s2, 1).map(|seg| seg.size_bytes()));
    // Check the file while it exists: process 0 creates it, the barrier holds it.
    let creator = Segment::create(&s).unwrap();
    let meta = std::fs::metadata(dir.join(&s.name)).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    creator.register(0);
    creator.barrier(Instant::now() + s.timeout, s.timeout).unwrap();
    creator.unlink().unwrap();
    assert_eq!(other.join().unwrap().unwrap(), creator.size_bytes());
    assert!(!dir.join(&s.name).exists());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no temporary left over"
    );
}

#[test]
fn attach_refuses_another_layout() {
    use std::os::unix::fs::FileExt;
    let dir = tmpdir("layout");
    let s = spec(&dir, 2);
    let _creator = Segment::create(&s).unwrap();
    // A build whose layout differs would have written another hash.
    let f = OpenOptions::new().write(true).open(dir.join(&s.name)).unwrap();
    f.write_all_at(
        &0xdead_beefu64.to_le_bytes(),
        offset_of!(SegHeader, layout_hash) as u64,
    )
    .unwrap();
    let err = Segment::attach(&s, Instant::now() + s.timeout).unwrap_err();
    assert!(
        matches!(
            err,
            ShmError::LayoutMismatch {
                theirs_hash: 0xdead_beef,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("same nemesis build"));
}

#[test]
fn attach_refuses_other_jobs_and_garbage() {
    let dir = tmpdir("job");
    let s = spec(&dir, 2);
    let _creator = Segment::create(&s).unwrap();
    let mut wrong = s.clone();
    wrong.job_id ^= 1;
    let err = Segment::attach(&wrong, Instant::now() + s.timeout).unwrap_err();
    assert!(matches!(err, ShmError::WrongJob { .. }), "{err}");
    let mut count = s.clone();
    count.nprocs = 3;
    assert!(matches!(
        Segment::attach(&count, Instant::now()).unwrap_err(),
        ShmError::WrongJob { .. }
    ));
    std::fs::write(dir.join("nemesis-garbage"), vec![7u8; 4096]).unwrap();
    std::fs::set_permissions(
        dir.join("nemesis-garbage"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let mut g = s.clone();
    g.name = "nemesis-garbage".into();
    let e = Segment::attach(&g, Instant::now()).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
    // A name that would reach outside the directory is refused before any path is made.
    g.name = format!("../{}", s.name);
    assert!(matches!(
        Segment::attach(&g, Instant::now()).unwrap_err(),
        ShmError::Config { .. }
    ));
}

#[test]
fn attach_times_out_when_nobody_creates() {
    let dir = tmpdir("timeout");
    let mut s = spec(&dir, 2);
    s.timeout = Duration::from_millis(50);
    let err = Segment::join(&s, 1).unwrap_err();
    assert!(matches!(err, ShmError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("NEMESIS_STARTUP_TIMEOUT"));
}

#[test]
fn barrier_times_out_naming_the_missing_and_leaves_no_file() {
    let dir = tmpdir("barrier");
    let mut s = spec(&dir, 3);
    s.timeout = Duration::from_millis(100);
    let err = Segment::join(&s, 0).unwrap_err();
    assert!(err.to_string().contains("[1, 2]"), "{err}");
    assert!(!dir.join(&s.name).exists());
}

#[test]
fn too_little_space_is_reported_up_front() {
    let dir = tmpdir("space");
    let mut s = spec(&dir, 64);
    s.geometry = Geometry {
        cells_per_proc: 1 << 20,
        cell_size: 16 << 20,
        fbox_size: 1152,
        fbox_slots: 0,
        pair_size: 0,
    };
    let err = Segment::create(&s).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, ShmError::NoSpace { .. } | ShmError::Config { .. }),
        "{msg}"
    );
    assert!(msg.contains("NEMESIS_CELLS"), "{msg}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// A message longer than a box runs over the next boxes; the receiver clears the
/// sequence words it overwrote, so bytes that look like the next number due are not
/// taken for a message.
/// An anonymous segment of two processes with `slots` fastboxes per ring.
fn ring_segment(slots: u32) -> Arc<Segment> {
    let geo = Geometry {
        fbox_slots: slots,
        ..Geometry::default()
    };
    Arc::new(Segment::anonymous(2, geo).unwrap())
}

#[test]
fn a_message_over_several_boxes_leaves_nothing_that_passes_for_one() {
    let seg = ring_segment(4);
    assert_eq!(seg.fbox_span(2000), 2);
    assert_eq!(seg.fbox_span(4 * 1152 - 32), 4, "at most the whole ring");
    assert_eq!(seg.fbox_span(4 * 1152 - 31), 0);
    let mut a = Port::new(seg.clone(), 0);
    let mut b = Port::new(seg, 1);
    let mut got = Vec::new();
    let poll = |b: &mut Port<Segment>, got: &mut Vec<(u64, Vec<u8>)>| {
        b.poll(|_, env, d| got.push((env[0], d.to_vec()))).unwrap();
    };
    // Message 1 takes boxes 0 and 1; where box 1's sequence word is, its bytes say 5,
    // the number of the message that box 1 will hold next.
    let mut long = vec![7u8; 2000];
    long[1120..1128].copy_from_slice(&5u64.to_le_bytes());
    a.try_send(1, &[1, 0], &[&long], long.len()).unwrap();
    a.try_send(1, &[2, 0], &[b"two"], 3).unwrap();
    a.try_send(1, &[3, 0], &[b"three"], 5).unwrap();
    assert_eq!(a.cells_for(1), 64, "all three went by fastbox");
    for _ in 0..3 {
        poll(&mut b, &mut got);
    }
    a.try_send(1, &[4, 0], &[b"four"], 4).unwrap();
    assert_eq!(a.cells_for(1), 64, "the ring wrapped to box 0");
    poll(&mut b, &mut got);
    poll(&mut b, &mut got);
    assert_eq!(got.len(), 4, "box 1 holds nothing yet");
    a.try_send(1, &[5, 0], &[b"five"], 4).unwrap();
    poll(&mut b, &mut got);
    assert_eq!(got.iter().map(|m| m.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    assert_eq!(got[0].1, long);
    assert_eq!(got[4].1, b"five");
}

#[test]
fn threads_stream_every_size_up_to_a_cell_through_the_ring() {
    let seg = ring_segment(8);
    let max = seg.cell_capacity();
    let mut a = Port::new(seg.clone(), 0);
    let mut b = Port::new(seg, 1);
    let sizes: Vec<usize> = (0..3000).map(|i| (i * 2731) % (max + 1)).collect();
    let send = sizes.clone();
    let t = std::thread::spawn(move || {
        for (i, &len) in send.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|k| (i + k) as u8).collect();
            while a.try_send(1, &[i as u64, 0], &[&data], len).is_err() {
                a.poll(|_, _, _| {}).unwrap();
                std::thread::yield_now();
            }
        }
    });
    let mut next = 0;
    while next < sizes.len() {
        b.poll(|_, env, d| {
            assert_eq!(env[0], next as u64, "out of order");
            assert_eq!(d.len(), sizes[next]);
            assert!(d.iter().enumerate().all(|(k, &x)| x == (next + k) as u8));
            next += 1;
        })
        .unwrap();
    }
    t.join().unwrap();
}

#[test]
fn anonymous_segment_carries_messages_between_threads() {
    let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
    let mut a = Port::new(seg.clone(), 0);
    let mut b = Port::new(seg, 1);
    let big = vec![3u8; 5000];
    a.try_send(1, &[1, 2], &[b"hello"], 5).unwrap();
    a.try_send(1, &[3, 4], &[&big], big.len()).unwrap();
    let t = std::thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < 2 {
            b.poll(|s, env, d| got.push((s, *env, d.to_vec()))).unwrap();
        }
        got
    });
    let got = t.join().unwrap();
    assert_eq!(got[0], (0, [1, 2], b"hello".to_vec()));
    assert_eq!(got[1].2, big);
}

#[test]
fn every_pair_has_a_buffer_of_its_own_that_both_see() {
    use crate::ring::Seg;
    let geo = Geometry {
        pair_size: 16 << 10,
        ..Geometry::default()
    };
    let seg = Segment::anonymous(4, geo).unwrap();
    assert!(seg.pair_buf(1, 1).is_none() && seg.pair_buf(0, 4).is_none());
    let pairs: Vec<(u32, u32)> = (0..4).flat_map(|a| (a + 1..4).map(move |b| (a, b))).collect();
    for &(a, b) in &pairs {
        let (x, y) = (seg.pair_buf(a, b).unwrap(), seg.pair_buf(b, a).unwrap());
        assert_eq!(x.capacity(), 16 << 10);
        assert!(x.try_claim() && y.held_by_peer(), "({a}, {b})");
        let fill = vec![(a * 4 + b) as u8; 16 << 10];
        // SAFETY: `fill` holds the bytes; `x` holds the buffer.
        unsafe { x.fill(&[Seg::of(&fill)], fill.len()) };
    }
    for &(a, b) in &pairs {
        let y = seg.pair_buf(b, a).unwrap();
        assert_eq!(y.written(), 16 << 10);
        let mut all = true;
        // SAFETY: the peer holds the buffer and published every byte.
        unsafe { y.read(0, 16 << 10, |s| all &= s.iter().all(|&c| c == (a * 4 + b) as u8)) };
        assert!(all, "pair ({a}, {b}) was written by another");
        y.release();
        assert!(!seg.pair_buf(a, b).unwrap().held_by_peer());
    }
}

#[test]
fn default_memory_for_64_processes() {
    let bytes = Segment::bytes_for(64, Geometry::default()).unwrap();
    // Cells: 64 x 64 x 8 KiB; a 1 KiB slot per process (its bell, queues, state and
    // split-transfer words); 64 x 63 rings of a 128-byte head and 4 fastboxes of
    // 1152 bytes, with room for 3 more after them; eight collective blocks of a
    // 384-byte head and 2 x 64 slots of 272 bytes; 64 x 63 / 2 pair buffers of a
    // 128-byte head and 16 KiB, the largest whose total fits the budget.
    let fboxes_end = 512 + 64 * 1024 + 64 * 63 * (128 + 7 * 1152usize);
    let colls = 8 * (384 + 2 * 64 * 272);
    let pairs = 64 * 63 / 2 * (128 + (16 << 10));
    assert_eq!(
        bytes,
        ((fboxes_end + colls).next_multiple_of(4096) + pairs).next_multiple_of(4096)
            + 64 * 64 * crate::config::DEFAULT_CELL_SIZE as usize
    );
    assert_eq!(Geometry::default().resolve(64).pair_size, 16 << 10);
    assert_eq!(Geometry::default().resolve(2).pair_size, 1 << 20);
    assert_eq!(
        Geometry::default().resolve(100).pair_size,
        0,
        "not even 16 KiB each fits"
    );
}

//! The benchmark CLI runs end to end and prints what its documentation promises. No
//! figure is checked here: speed is for benchmarks, not tests.

use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_nemesis-bench");

fn json_lines(args: &[&str]) -> Vec<String> {
    let o = Command::new(BENCH).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {:?}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(
            l.starts_with('{') && l.ends_with('}'),
            "not one JSON object per line: {l}"
        );
    }
    lines
}

fn has(line: &str, keys: &[&str]) {
    for k in keys {
        assert!(line.contains(&format!("\"{k}\":")), "{k} missing from {line}");
    }
}

#[test]
fn latency_json_carries_the_documented_fields() {
    let lines = json_lines(&[
        "latency", "--sizes", "0,8", "--iters", "200", "--warmup", "20", "--rounds", "1", "--json",
    ]);
    assert_eq!(lines.len(), 2);
    for l in &lines {
        assert!(l.contains("\"bench\":\"latency\""));
        has(
            l,
            &["size", "p50_ns", "probe_ns", "ratio", "floor_ns", "placement"],
        );
    }
}

/// `--near-below` moves the bound between the placements: every probe takes at least
/// a nanosecond and none takes a millisecond.
#[test]
fn the_placement_bound_is_the_callers() {
    for (bound, want) in [("1", "far"), ("1000000", "near")] {
        let lines = json_lines(&[
            "--near-below",
            bound,
            "latency",
            "--sizes",
            "8",
            "--iters",
            "100",
            "--warmup",
            "10",
            "--rounds",
            "2",
            "--json",
        ]);
        for l in &lines {
            assert!(
                l.contains(&format!("\"placement\":\"{want}\"")),
                "--near-below {bound}: {l}"
            );
        }
    }
    for bad in ["0", "x", "NaN", "inf"] {
        let o = Command::new(BENCH)
            .args(["latency", "--near-below", bad])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "--near-below {bad}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("is not a time in ns above zero"),
            "--near-below {bad}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn stream_ring_and_memory_json() {
    has(
        &json_lines(&[
            "bw", "--layer", "channel", "--sizes", "64,20K", "--iters", "3", "--warmup", "1", "--rounds",
            "1", "--json",
        ])[1],
        &["size", "mb_s"],
    );
    let bw = json_lines(&[
        "bw",
        "--sizes",
        "1K,64K",
        "--lmt",
        "auto,ring,chunks",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--rounds",
        "1",
        "--json",
    ]);
    assert_eq!(bw.len(), 6);
    for l in &bw {
        assert!(l.contains("\"bench\":\"bw\""), "{l}");
        has(
            l,
            &[
                "size",
                "mb_s",
                "memcpy_mb_s",
                "lmt",
                "used",
                "probe_ns",
                "recv_buffers",
                "sent_paired",
                "sent_packets",
                "sent_stream_packets",
                "sent_rendezvous",
            ],
        );
        assert!(!l.contains("mib_s"), "one unit: {l}");
    }
    // Its first windows as medium messages; a later one may be a look at the rendezvous
    // (`medium+` the strategy), as the stream's way is chosen by time.
    assert!(
        bw[3].contains("\"lmt\":\"auto\"") && bw[3].contains("\"used\":\"medium"),
        "64 KiB goes as a medium message: {}",
        bw[3]
    );
    let osu = json_lines(&[
        "bw", "--osu", "--sizes", "1K,300K", "--iters", "2", "--warmup", "1", "--rounds", "1", "--json",
    ]);
    assert_eq!(osu.len(), 2);
    for l in &osu {
        assert!(l.contains("\"recv_buffers\":\"one\""), "{l}");
    }
    // Above a cell the two-sided latency is measured, and the channel's beside it, its
    // message in packets.
    let lat = json_lines(&[
        "latency", "--layer", "p2p", "--sizes", "8,64K", "--iters", "50", "--warmup", "5", "--rounds", "1",
        "--json",
    ]);
    assert_eq!(lat.len(), 2);
    assert!(
        lat[0].contains("channel_ratio") && lat[1].contains("channel_ratio"),
        "{lat:?}"
    );
    assert!(
        bw[4].contains("\"lmt\":\"ring\"") && bw[4].contains("\"used\":\"ring\""),
        "{}",
        bw[4]
    );
    // A strategy forced, every message above the eager limit goes by rendezvous: the
    // sender's counts say so.
    assert!(
        bw[4].contains("\"sent_packets\":0,") && !bw[4].contains("\"sent_rendezvous\":0"),
        "{}",
        bw[4]
    );
    let o = Command::new(BENCH)
        .args(["bw", "--lmt", "carrier-pigeon"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--lmt carrier-pigeon"));
    let cal = json_lines(&[
        "calibrate",
        "--sizes",
        "64K,256K",
        "--window",
        "2",
        "--rounds",
        "1",
        "--stream-sizes",
        "32K,64K",
        "--json",
    ]);
    let last = cal
        .iter()
        .find(|l| l.contains("\"recommended\""))
        .expect("a recommendation");
    has(last, &["recommended", "ring_of_best", "probe_ns"]);
    // What calibrate recommends, the library takes.
    let rec = last
        .split("\"recommended\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a recommended value");
    let p = nemesis::lmt::Policy::from_lookup(|k| (k == "NEMESIS_LMT_AUTO").then(|| rec.to_string()))
        .unwrap_or_else(|e| panic!("calibrate recommended {rec:?}, which the library refuses: {e}"));
    assert!(!p.auto_order(1 << 20).is_empty(), "{rec}");
    // The streams of medium sizes, both ways and both shapes, then the limit to set,
    // which the library takes as it is.
    let streams: Vec<&String> = cal
        .iter()
        .filter(|l| l.contains("\"calibrate_stream\""))
        .collect();
    assert_eq!(streams.len(), 5, "{streams:?}");
    has(
        streams[0],
        &["size", "recv_buffers", "packets_mb_s", "rendezvous_mb_s"],
    );
    let limit: usize = streams[4]
        .split("\"recommended_stream_medium_limit\":")
        .nth(1)
        .and_then(|r| r.trim_end_matches('}').parse().ok())
        .unwrap_or_else(|| panic!("a stream limit in {}", streams[4]));
    let cfg = nemesis::p2p::Config::from_lookup(8160, |k| {
        (k == "NEMESIS_STREAM_MEDIUM_LIMIT").then(|| limit.to_string())
    })
    .unwrap_or_else(|e| panic!("calibrate recommended {limit}, which the library refuses: {e}"));
    assert!(
        // Below the first size, between the two, or none.
        [(32 << 10) - 1, 32 << 10, nemesis::p2p::MAX_MEDIUM_LIMIT].contains(&limit),
        "{limit}"
    );
    assert_eq!(cfg.stream_medium_limit, limit.min(cfg.medium_limit));
    assert!(
        cal[0].contains("\"strategy\"") && cal[0].contains("\"mb_s\""),
        "{}",
        cal[0]
    );
    let rate = &json_lines(&[
        "msgrate", "--sizes", "8", "--iters", "3", "--warmup", "1", "--rounds", "1", "--json",
    ])[0];
    has(rate, &["msgs_per_s", "channel_msgs_per_s", "channel_ratio"]);
    assert!(rate.contains("\"layer\":\"p2p\""), "two-sided by default: {rate}");
    let rate = &json_lines(&[
        "msgrate", "--layer", "channel", "--sizes", "8", "--iters", "3", "--warmup", "1", "--rounds", "1",
        "--json",
    ])[0];
    assert!(
        rate.contains("\"layer\":\"channel\"") && !rate.contains("channel_ratio"),
        "{rate}"
    );
    has(
        &json_lines(&["ring", "--procs", "3", "--messages", "100", "--json"])[0],
        &["procs", "per_hop_ns"],
    );
    let mem = json_lines(&["memory", "--procs", "2,64", "--udp-peers", "2,5", "--json"]);
    assert_eq!(mem.len(), 4);
    has(
        &mem[1],
        &[
            "segment_bytes",
            "per_process_bytes",
            "fastbox_bytes_per_pair",
            "pair_buffer_bytes",
        ],
    );
    assert!(mem[0].contains("\"pair_buffer_bytes\":1048576"), "{}", mem[0]);
    assert!(mem[1].contains("\"pair_buffer_bytes\":16384"), "{}", mem[1]);
    for l in &mem[2..] {
        assert!(l.contains("\"transport\":\"udp\""), "{l}");
        has(l, &["peers", "endpoint_bytes", "idle_bytes", "per_peer_bytes"]);
    }
}

#[test]
fn network_transports_carry_their_name_and_the_plain_tcp_reference() {
    let lat = json_lines(&[
        "latency",
        "--transport",
        "tcp,udp",
        "--sizes",
        "8",
        "--iters",
        "100",
        "--warmup",
        "10",
        "--rounds",
        "1",
        "--json",
    ]);
    assert_eq!(lat.len(), 2);
    for (l, t) in lat.iter().zip(["tcp", "udp"]) {
        assert!(l.contains(&format!("\"transport\":\"{t}\"")), "{l}");
        has(
            l,
            &[
                "p50_ns",
                "probe_ns",
                "ratio",
                "tcp_ns",
                "tcp_ratio",
                "tcp_spin_ns",
                "tcp_spin_ratio",
            ],
        );
    }
    let bw = json_lines(&[
        "bw",
        "--transport",
        "shm,udp",
        "--sizes",
        "1K,100K",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--rounds",
        "1",
        "--json",
    ]);
    assert_eq!(bw.len(), 4);
    assert!(!bw[0].contains("tcp_mb_s") && bw[1].contains("\"transport\":\"udp\""));
    has(&bw[3], &["mb_s", "tcp_mb_s", "tcp_ratio", "used"]);
    assert!(bw[3].contains("\"used\":\"chunks\""), "{}", bw[3]);
    let o = Command::new(BENCH)
        .args(["latency", "--transport", "tcp,tcp", "--rounds", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("given twice"));
}

/// Over a netmod the channel's packets may be longer than a shared-memory cell (8 KiB
/// and a little), and the channel layer measures them; past the netmod's own largest
/// packet, a message goes as several.
#[test]
fn the_channel_layer_over_a_netmod_takes_packets_longer_than_a_cell() {
    let lat = json_lines(&[
        "latency",
        "--layer",
        "channel",
        "--transport",
        "tcp,udp",
        "--sizes",
        "16K",
        "--iters",
        "50",
        "--warmup",
        "5",
        "--rounds",
        "1",
        "--json",
    ]);
    assert_eq!(lat.len(), 2);
    for (l, t) in lat.iter().zip(["tcp", "udp"]) {
        assert!(l.contains(&format!("\"transport\":\"{t}\"")), "{l}");
        assert!(l.contains("\"size\":16384"), "{l}");
        has(l, &["p50_ns"]);
    }
    let big = json_lines(&[
        "latency",
        "--layer",
        "channel",
        "--transport",
        "udp",
        "--sizes",
        "1M",
        "--iters",
        "5",
        "--warmup",
        "1",
        "--rounds",
        "1",
        "--json",
    ]);
    assert_eq!(big.len(), 1);
    assert!(big[0].contains("\"size\":1048576"), "{}", big[0]);
    has(&big[0], &["p50_ns"]);
}

/// Above the channel's largest packet, a channel ping-pong sends the message as packets
/// of that size and the echo returns it once all came: the two-sided figure has a
/// channel figure beside it at every size.
#[test]
fn a_channel_ping_pong_above_one_packet_goes_as_several() {
    let lat = json_lines(&[
        "latency", "--layer", "p2p", "--sizes", "20K,200K", "--iters", "20", "--warmup", "2", "--rounds",
        "1", "--json",
    ]);
    assert_eq!(lat.len(), 2);
    for (l, size) in lat.iter().zip(["20480", "204800"]) {
        assert!(l.contains(&format!("\"size\":{size}")), "{l}");
        has(l, &["p50_ns", "channel_ns", "channel_ratio"]);
    }
    let chan = json_lines(&[
        "latency", "--layer", "channel", "--sizes", "64K", "--iters", "20", "--warmup", "2", "--rounds", "1",
        "--json",
    ]);
    assert_eq!(chan.len(), 1);
    assert!(
        chan[0].contains("\"layer\":\"channel\"") && chan[0].contains("\"size\":65536"),
        "{}",
        chan[0]
    );
    has(&chan[0], &["p50_ns"]);
}

#[test]
fn tables_without_json_and_help() {
    let o = Command::new(BENCH)
        .args(["latency", "--sizes", "8", "--iters", "100", "--rounds", "1"])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("probe ns"));
    let o = Command::new(BENCH).arg("--help").output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("latency"));
    // A bandwidth of empty messages has no ratio to memcpy's: a dash, not "NaN".
    let o = Command::new(BENCH)
        .args(["bw", "--sizes", "0", "--iters", "10", "--rounds", "1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out.lines().find(|l| !l.starts_with('#')).expect("a row");
    assert!(
        !row.contains("NaN") && row.split_whitespace().any(|w| w == "-"),
        "{row}"
    );
}

/// A reader that goes away early (`nemesis-bench memory | head -1`) ends the program
/// quietly, with status 0; an output that cannot be written to fails it with status 1,
/// saying why. Neither panics.
#[test]
fn a_closed_or_full_output_ends_the_program_without_a_panic() {
    let mut child = Command::new(BENCH)
        .args(["memory", "--procs", "2,4"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The only reader goes before the first line is written.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !err.contains("panicked"),
        "{:?}: {err}",
        o.status
    );

    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return;
    };
    let o = Command::new(BENCH)
        .args(["memory", "--procs", "2"])
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("writing to standard output") && !err.contains("panicked"),
        "{err}"
    );
}

/// The number after `"key":` in a JSON line.
fn number(line: &str, key: &str) -> f64 {
    let at = line
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} missing from {line}"))
        + key.len()
        + 3;
    let end = line[at..].find([',', '}']).map_or(line.len(), |e| at + e);
    line[at..end]
        .parse()
        .unwrap_or_else(|e| panic!("{key} in {line}: {e}"))
}

#[test]
fn msgrate_phases_are_each_sides_steps_and_add_up_to_no_more_than_a_window() {
    let keys = [
        "send_isends_ns",
        "send_waitall_ns",
        "send_ack_wait_ns",
        "recv_irecvs_ns",
        "recv_waitall_ns",
        "recv_ack_ns",
    ];
    let rows = json_lines(&[
        "msgrate", "--sizes", "8,4K", "--iters", "200", "--warmup", "5", "--rounds", "1", "--phases",
        "--json",
    ]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        has(row, &keys);
        let step = |k| number(row, k);
        for k in keys {
            assert!(step(k) >= 0.0, "{k}: {row}");
        }
        // Every window posts, sends and waits: none of those takes no time at all.
        for k in ["send_isends_ns", "recv_irecvs_ns", "recv_waitall_ns"] {
            assert!(step(k) > 0.0, "{k}: {row}");
        }
        // The sender's three steps are its whole window. Medians, so a window the
        // scheduler stretched moves them less than the mean the rate comes from: their
        // sum is at most about one window's mean time, here within a factor of two.
        let window_ns = 64.0 / number(row, "msgs_per_s") * 1e9;
        let sender = step("send_isends_ns") + step("send_waitall_ns") + step("send_ack_wait_ns");
        assert!(
            sender <= 2.0 * window_ns,
            "the sender's steps take {sender} ns of a {window_ns} ns window: {row}"
        );
    }
    // Without --phases, no step is reported.
    let plain = &json_lines(&[
        "msgrate", "--sizes", "8", "--iters", "3", "--warmup", "1", "--rounds", "1", "--json",
    ])[0];
    assert!(!plain.contains("send_isends_ns"), "{plain}");
}

#[test]
fn bad_arguments_are_refused() {
    for args in [
        &["latency", "--sizes", "8x"][..],
        &["ring", "--procs", "1"],
        &["bw", "--window", "0"],
        &["bw", "--recv-skew", "4096"],
        &["latency", "--transport", "pigeon"],
        &["rma", "--ops", "teleport"],
        &["rma", "--sync", "sometimes"],
        &["rma", "--ops", "get_serial"],
        &["rma", "--executor", "gpu"],
        &["nonsense"],
    ] {
        let o = Command::new(BENCH).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
    // A size no machine here could hold is refused by name, before any buffer is
    // asked for (it aborted in an allocation before).
    for cmd in ["latency", "bw", "msgrate"] {
        let o = Command::new(BENCH)
            .args([cmd, "--sizes", "8,99999999999999"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{cmd}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("larger than 1G"), "{cmd}: {err}");
    }
    // Runs that cannot be made are errors that say why, not panics: the card as
    // executor where the netmod has no RDMA atomics; without the verbs feature (as these
    // tests build it), the verbs netmods named as such, not as unknown.
    for (args, want) in [
        (
            &[
                "rma",
                "--ops",
                "fop",
                "--executor",
                "nic",
                "--iters",
                "10",
                "--rounds",
                "1",
            ][..],
            "no RDMA atomics",
        ),
        (
            &["memory", "--procs", "2", "--udp-peers", "2", "--rc-peers", "2"],
            "`verbs` feature",
        ),
        (
            &["latency", "--recv-skew", "16", "--sizes", "8", "--rounds", "1"],
            "use --layer p2p",
        ),
        (
            &["msgrate", "--layer", "channel", "--phases", "--rounds", "1"],
            "--layer channel has none",
        ),
        (
            &[
                "bw",
                "--buffers",
                "pinned",
                "--recv-skew",
                "16",
                "--sizes",
                "16K",
                "--rounds",
                "1",
            ],
            "pinned buffers",
        ),
        (
            &[
                "latency",
                "--transport",
                "ud",
                "--sizes",
                "8",
                "--iters",
                "10",
                "--rounds",
                "1",
            ],
            "`verbs` feature",
        ),
    ] {
        let o = Command::new(BENCH).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(want),
            "{args:?}: {o:?}"
        );
    }
}

#[test]
fn requests_json_carries_both_ways_of_waiting() {
    let lines = json_lines(&["requests", "--counts", "200", "--rounds", "1", "--json"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (l, api) in lines.iter().zip(["test_some", "waitall"]) {
        assert!(l.contains(&format!("\"api\":\"{api}\"")), "{l}");
        has(
            l,
            &[
                "bench",
                "count",
                "post_ns_per_request",
                "finish_ns_per_request",
                "empty_tests",
            ],
        );
    }
    let o = Command::new(BENCH)
        .args(["requests", "--counts", "0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--counts"));
}

/// `peers` against a stand-in peer with fixed figures: every test comes back with the
/// peer's figure and the ratio to nemesis's, the collectives included; and a peer that
/// fails or a bad spec is a clear error.
#[test]
fn peers_compare_with_a_stand_in() {
    let fake = format!("sh {}/tests/data/fake_peer.sh", env!("CARGO_MANIFEST_DIR"));
    let peer = format!("fake={fake}");
    let coll = format!("fake={fake} --procs {{procs}}");
    let rows = json_lines(&[
        "--json",
        "peers",
        "--peer",
        &peer,
        "--peer-coll",
        &coll,
        "--lat-sizes",
        "8",
        "--bw-sizes",
        "4K",
        "--rate-sizes",
        "8",
        "--coll-procs",
        "2",
        "--rounds",
        "1",
        "--lat-iters",
        "100",
        "--rate-iters",
        "20",
        "--coll-iters",
        "20",
    ]);
    let tests: Vec<&str> = ["latency", "bw", "msgrate", "barrier", "allreduce"].to_vec();
    assert_eq!(rows.len(), tests.len(), "{rows:?}");
    for (row, test) in rows.iter().zip(tests) {
        assert!(row.contains(&format!("\"test\":\"{test}\"")), "{row}");
        has(
            row,
            &[
                "nemesis",
                "peer_value",
                "ratio",
                "near_rounds",
                "far_rounds",
                "probe_ns",
                "placement",
                "cpu",
            ],
        );
        let want = match test {
            "latency" => "100.000",
            "bw" => "1000.000",
            "msgrate" => "1000000.000",
            "barrier" => "1000.000",
            _ => "2000.000",
        };
        assert!(row.contains(&format!("\"peer_value\":{want}")), "{row}");
    }
    assert!(rows[3].contains("nemesis_node_ns"), "{}", rows[3]);
    for (args, want) in [
        (vec!["peers", "--peer", "broken=false"], "failed"),
        (vec!["peers", "--peer", "nameonly"], "NAME=COMMAND"),
        (
            vec!["peers", "--peer", &peer, "--peer-coll", "other=x {procs}"],
            "no --peer of that name",
        ),
        (
            vec!["peers", "--peer", &peer, "--peer-coll", "fake=no count"],
            "no {procs}",
        ),
    ] {
        let o = Command::new(BENCH)
            .args(&args)
            .args([
                "--rounds",
                "1",
                "--lat-sizes",
                "8",
                "--bw-sizes",
                "none",
                "--rate-sizes",
                "",
                "--lat-iters",
                "100",
            ])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn one_sided_json_carries_every_operation_and_the_overlap() {
    let lines = json_lines(&[
        "rma",
        "--iters",
        "50",
        "--warmup",
        "5",
        "--rounds",
        "1",
        "--bw-size",
        "256K",
        "--transport",
        "shm,tcp",
        "--json",
    ]);
    for transport in ["shm", "tcp"] {
        let rows: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains(&format!("\"transport\":\"{transport}\"")))
            .collect();
        for op in ["put", "get", "acc", "fop", "cas", "lock", "get_bw", "overlap"] {
            let row = rows
                .iter()
                .find(|l| l.contains(&format!("\"op\":\"{op}\"")))
                .unwrap_or_else(|| panic!("no {op} row over {transport}: {lines:?}"));
            match op {
                "get_bw" => has(row, &["mb_s", "p2p_mb_s", "p2p_ratio"]),
                "overlap" => has(row, &["serial_ns", "pipelined_ns", "compute_ns", "overlap"]),
                _ => has(
                    row,
                    &[
                        "p50_ns",
                        "probe_ratio",
                        "p2p_rtt_ns",
                        "p2p_rtt_ratio",
                        "placement",
                    ],
                ),
            }
        }
        // put, get and acc with each of flush and fence.
        assert_eq!(
            rows.iter().filter(|l| l.contains("\"sync\":\"fence\"")).count(),
            3,
            "{rows:?}"
        );
    }
}

//! The partner: rank 1 of a pair, started by rank 0 from the same executable, which
//! obeys its control packets.

use super::phases::{self, Steps};
use super::{
    Buf, BufKind, CPU_VAR, KIND_ACK, KIND_CTRL, MeasureError, OP_ECHO, OP_ECHO_P2P, OP_FLOOR, OP_PROBE,
    OP_QUIT, OP_RMA, OP_SINK, OP_SINK_P2P, OP_TCP_CONNECT, OP_TCP_ECHO, OP_TCP_SINK, PHASES_TAG, PageAligned,
    ROLE_VAR, Result, SINK_BYTES, SINK_OSU_BIT, SINK_PHASES_BIT, SINK_PINNED_BIT, SINK_SKEW_SHIFT, args_of,
    blocking_recv, coll, early, pin_to, probe_segment, read_all, recv_pieces, ring, rma, send_pieces,
    set_lmt, settle, spin_recv,
};
use nemesis::channel::{Channel, Header, NemesisChannel};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// If this process was started as a measurement partner, plays its role and exits.
/// Call it first thing in `main` of any program that uses [`Pair`](super::Pair) or
/// [`Ring`](super::Ring).
pub fn serve_if_partner() {
    let Ok(role) = std::env::var(ROLE_VAR) else { return };
    let r = match role.as_str() {
        "partner" => partner(),
        "ring" => ring::rank(),
        "coll" => coll::coll_rank(),
        other => Err(MeasureError::Other(format!("unknown {ROLE_VAR}={other:?}"))),
    };
    match r {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("nemesis measurement {role}: {e}");
            std::process::exit(1);
        }
    }
}

/// The partner's side: obey control packets until told to quit.
pub(super) fn partner() -> Result<()> {
    if let Some(cpu) = std::env::var(CPU_VAR).ok().and_then(|c| c.parse().ok()) {
        pin_to(cpu).map_err(|e| MeasureError::Other(format!("pinning to cpu {cpu}: {e}")))?;
    }
    let mut ch = NemesisChannel::init()?;
    let probe_seg = probe_segment(&ch)?;
    let mut buf = vec![0u8; ch.max_payload_to(0).max(24)];
    let mut tcp: Option<TcpStream> = None;
    // Our parent's death kills us (parent-death signal); nothing else to watch.
    let mut alive = || Ok(());
    let policy = ch.shm().wait_policy();
    // Between measurements, sleep at once rather than spin or yield: another pair may
    // be measuring on the same CPU.
    let idle = nemesis::WaitPolicy {
        spin: 0,
        yields: 0,
        ..policy
    };
    // Commands not obeyed yet, in order: those a world of the partner's took while it
    // ran, and any that came in one poll with another.
    let mut early = early::Stash::new();
    loop {
        if early.is_empty() {
            ch.shm_mut().set_wait_policy(idle);
            let got = blocking_recv(&mut ch, &mut early, &mut alive);
            ch.shm_mut().set_wait_policy(policy);
            got?;
        }
        let Some((h, data)) = early.pop_front() else {
            continue;
        };
        let len = data.len().min(buf.len());
        buf[..len].copy_from_slice(&data[..len]);
        if h.kind != KIND_CTRL {
            return Err(MeasureError::Protocol(format!(
                "expected a control packet, got {h:?}"
            )));
        }
        let [count, arg, _] = args_of(&buf[..len])?;
        let ack = Header {
            kind: KIND_ACK,
            aux: h.aux,
            ..Header::default()
        };
        match h.aux {
            // `arg`: 0 for messages of one packet, echoed packet by packet; else the
            // length of a message sent as several, echoed once all of it came.
            OP_ECHO if arg > 0 => {
                ch.send_bytes(0, ack, &[])?;
                let mut msg = vec![0u8; arg as usize];
                let max = ch.max_payload_to(0);
                for _ in 0..count {
                    recv_pieces(&mut ch, &mut msg, arg as usize, &mut alive)?;
                    send_pieces(&mut ch, 0, &msg, max)?;
                }
            }
            OP_ECHO => {
                ch.send_bytes(0, ack, &[])?;
                for _ in 0..count {
                    let (h, len) = spin_recv(&mut ch, &mut buf, &mut alive)?;
                    ch.send_bytes(0, h, &buf[..len])?;
                }
            }
            OP_ECHO_P2P => {
                ch.send_bytes(0, ack, &[])?;
                let skew = args_of(&buf[..len])?[2] as usize;
                early::with_world(&mut ch, &mut early, |w| {
                    let c = w.comm();
                    let mut big = PageAligned::at(arg as usize, skew);
                    for _ in 0..count {
                        let st = w
                            .recv(&c, 0, 0, &mut big)
                            .map_err(|e| MeasureError::Other(e.to_string()))?;
                        w.send(&c, 0, 0, &big[..st.len])
                            .map_err(|e| MeasureError::Other(e.to_string()))?;
                    }
                    Ok(())
                })?;
            }
            OP_PROBE | OP_FLOOR => {
                let seg = probe_seg.clone();
                let [ping_line, pong_line] = seg.probe_lines();
                let pong_line = if h.aux == OP_PROBE { ping_line } else { pong_line };
                ch.send_bytes(0, ack, &[])?;
                settle(&mut ch)?;
                for i in 0..count {
                    while ping_line.load(Ordering::Acquire) != arg + 2 * i + 1 {
                        core::hint::spin_loop();
                    }
                    pong_line.store(arg + 2 * i + 2, Ordering::Release);
                }
            }
            OP_SINK => {
                ch.send_bytes(0, ack, &[])?;
                let (total, per_ack) = (count, arg.max(1));
                let mut seen = 0u64;
                while seen < total {
                    let before = seen;
                    ch.poll(|p| {
                        let n = p.payload.len().min(buf.len());
                        buf[..n].copy_from_slice(&p.payload[..n]);
                        seen += 1;
                    })?;
                    if seen / per_ack > before / per_ack {
                        ch.send_bytes(0, ack, &[])?;
                    }
                }
            }
            OP_SINK_P2P => {
                let (window, code, size_arg) =
                    (arg & 0xffff_ffff, arg >> 32 & 0xff, args_of(&buf[..len])?[2]);
                let osu = arg >> SINK_OSU_BIT & 1 == 1;
                // Step times asked for: the warm-up's windows, to leave out, are in the
                // size's upper half.
                let phases = arg >> SINK_PHASES_BIT & 1 == 1;
                let (size, warmup) = if phases {
                    (size_arg & 0xffff_ffff, size_arg >> 32)
                } else {
                    (size_arg, 0)
                };
                let skew = (arg >> SINK_SKEW_SHIFT & 0xfff) as usize;
                let kind = if arg >> SINK_PINNED_BIT & 1 == 1 {
                    BufKind::Pinned
                } else {
                    BufKind::Heap
                };
                set_lmt(&mut ch, code)?;
                ch.send_bytes(0, ack, &[])?;
                let other = |e: nemesis::P2pError| MeasureError::Other(e.to_string());
                early::with_world(&mut ch, &mut early, |w| {
                    let c = w.comm();
                    // As osu_bw does, the window's receives are posted before any arrives, so a
                    // rendezvous's handshakes overlap; as many buffers as fit SINK_BYTES.
                    let depth = (SINK_BYTES / size.max(1)).clamp(1, window) as usize;
                    let depth = if osu { 1 } else { depth };
                    let mut sinks: Vec<Buf> = (0..depth)
                        .map(|_| kind.make_at(size as usize, skew))
                        .collect::<Result<_>>()?;
                    let mut steps = phases.then(|| Steps::new(count.saturating_sub(warmup)));
                    for it in 0..count {
                        if let Some(t) = steps.as_mut() {
                            if it == warmup {
                                t.clear();
                            }
                            t.start();
                        }
                        if osu {
                            // osu_bw's receiver: the whole window posted into one buffer.
                            let (p, n) = (sinks[0].as_mut_ptr(), size as usize);
                            w.scope(|s| {
                                // As osu_bw's array of requests, made before the window,
                                // and as the sender's: collected from an iterator of
                                // results, the requests were moved three times each.
                                let mut reqs = Vec::with_capacity(window as usize);
                                for _ in 0..window {
                                    // SAFETY: the buffer outlives the scope, and only these
                                    // receives touch it until the scope ends.
                                    reqs.push(unsafe { s.irecv_raw(&c, 0, 1, p, n) }?);
                                }
                                if let Some(t) = steps.as_mut() {
                                    t.mark(0);
                                }
                                s.waitall(reqs).map(|_| ())
                            })
                            .map_err(other)?;
                            if let Some(t) = steps.as_mut() {
                                t.mark(1);
                            }
                            w.send(&c, 0, 2, &[0; 4]).map_err(other)?;
                            if let Some(t) = steps.as_mut() {
                                t.mark(2);
                                t.end();
                            }
                            continue;
                        }
                        let mut left = window as usize;
                        while left > 0 {
                            let k = left.min(depth);
                            w.scope(|s| {
                                let mut reqs = Vec::with_capacity(k);
                                for b in &mut sinks[..k] {
                                    reqs.push(s.irecv(&c, 0, 1, &mut b[..])?);
                                }
                                if let Some(t) = steps.as_mut() {
                                    t.mark(0);
                                }
                                s.waitall(reqs).map(|_| ())
                            })
                            .map_err(other)?;
                            if let Some(t) = steps.as_mut() {
                                t.mark(1);
                            }
                            left -= k;
                        }
                        w.send(&c, 0, 2, &[0; 4]).map_err(other)?;
                        if let Some(t) = steps.as_mut() {
                            t.mark(2);
                            t.end();
                        }
                    }
                    if let Some(t) = steps {
                        w.send(&c, 0, PHASES_TAG, &phases::encode(t.medians()))
                            .map_err(other)?;
                    }
                    Ok(())
                })?;
            }
            OP_TCP_CONNECT => {
                let s = TcpStream::connect((Ipv4Addr::LOCALHOST, count as u16))
                    .and_then(|s| s.set_nodelay(true).map(|_| s))
                    .map_err(|e| MeasureError::Other(format!("plain tcp connect: {e}")))?;
                tcp = Some(s);
                ch.send_bytes(0, ack, &[])?;
                settle(&mut ch)?;
            }
            OP_TCP_ECHO | OP_TCP_SINK => {
                let s = tcp
                    .as_mut()
                    .ok_or_else(|| MeasureError::Protocol("plain tcp is not connected".into()))?;
                let [_, arg2, arg3] = args_of(&buf[..len])?;
                ch.send_bytes(0, ack, &[])?;
                settle(&mut ch)?;
                let io = |e: std::io::Error| MeasureError::Other(format!("plain tcp: {e}"));
                if h.aux == OP_TCP_ECHO {
                    let mut m = vec![0u8; arg as usize];
                    s.set_nonblocking(arg3 != 0).map_err(io)?;
                    for _ in 0..count {
                        read_all(s, &mut m).map_err(io)?;
                        s.write_all(&m).map_err(io)?;
                    }
                    s.set_nonblocking(false).map_err(io)?;
                } else {
                    let (window, size) = (arg2, arg3 as usize);
                    let mut m = PageAligned::new(size);
                    for _ in 0..count {
                        for _ in 0..window {
                            s.read_exact(&mut m).map_err(io)?;
                        }
                        s.write_all(&[0; 4]).map_err(io)?;
                    }
                }
            }
            OP_RMA => {
                let code = args_of(&buf[..len])?[2];
                ch.send_bytes(0, ack, &[])?;
                rma::serve(&mut ch, &mut early, count, arg, code)?;
            }
            OP_QUIT => {
                ch.flush(Duration::from_secs(10))?;
                return Ok(());
            }
            op => return Err(MeasureError::Protocol(format!("unknown op {op}"))),
        }
    }
}

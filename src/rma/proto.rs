//! The one-sided protocol on the progress core: every packet of
//! [`ProtocolId::RMA`] lands here, whichever call of the world is polling. Requests go
//! to the target side of their window ([`super::target`]); replies are filed with the
//! origin's request they answer, where the origin's epoch finds them.

use super::idmap::IdMap;
use super::target::TargetWin;
use super::wire::{self, Msg, Refusal};
use crate::channel::{Header, Packet, Rank};
use crate::progress::{Outbox, Protocol, ProtocolId};
use nemesis_net::rdma::{OpId, Rdma, Registration};
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

/// What keeps a window's memory alive while its target serves it.
pub(crate) type Keep = Arc<dyn Any + Send + Sync>;

/// What an origin's request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// `RESULT`s carrying this many bytes, in order.
    Data(usize),
    /// A `GRANT`.
    Grant,
    /// An `ACK`.
    Ack,
}

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Still waiting.
    Waiting,
    /// Answered in full.
    Done,
    /// The target refused it.
    Refused(Refusal, u64, u64),
    /// The target broke the protocol answering it.
    Broken(&'static str),
}

/// An origin's request awaiting its answer.
#[derive(Debug)]
pub(crate) struct Pending {
    /// The target's world rank.
    pub(crate) target: Rank,
    pub(crate) want: Want,
    /// Bytes arrived so far (for `Want::Data`), in order.
    pub(crate) got: usize,
    /// Arrived bytes held here for the caller's buffer: those from `base` on.
    pub(crate) staged: Vec<u8>,
    pub(crate) base: usize,
    /// The caller's buffer, where arriving bytes go straight while the origin waits
    /// for them.
    pub(crate) dest: Option<Dest>,
    pub(crate) state: State,
}

/// A caller's buffer of a request's full length, lent for the length of one wait of
/// the origin's epoch (which holds the buffer borrowed meanwhile, and takes it back
/// before returning, even by unwinding).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dest(pub(crate) *mut u8);

// SAFETY: a `Dest` is written only by the progress of the process that lent it, during
// the wait it was lent for; it moves between threads only with the world.
unsafe impl Send for Dest {}

/// A refusal of a request that has no answer of its own (a put, an accumulate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) target: Rank,
    pub(crate) why: Option<Refusal>,
    pub(crate) disp: u64,
    pub(crate) len: u64,
}

/// A transfer the network module's RDMA does for this origin.
#[derive(Debug)]
pub(crate) struct Xfer {
    pub(crate) op: OpId,
    /// The target's world rank.
    pub(crate) target: Rank,
    /// The registration of `buf`, ended with the transfer.
    pub(crate) reg: Registration,
    /// What a put sends, or where a get lands: owned here, so that the device never
    /// writes into memory that a forgotten epoch gave back to the program.
    pub(crate) buf: Vec<u8>,
    /// The request a get answers; 0 for a put.
    pub(crate) req: u32,
}

/// One window as an origin sees it.
#[derive(Debug)]
pub(crate) struct OriginWin {
    next_req: u32,
    pub(crate) pending: IdMap<u32, Pending>,
    /// Refusals of requests without answers, not reported yet.
    pub(crate) refusals: Vec<Refused>,
    /// Such refusals received so far.
    pub(crate) refusals_seen: u64,
    /// Posts received from each target (world rank).
    pub(crate) posts: IdMap<Rank, u32>,
    /// Requests sent to each member (by communicator rank) so far: what a fence counts.
    pub(crate) issued: Vec<u64>,
    /// Members sent puts or accumulates since the last flush of them.
    pub(crate) unflushed: Vec<bool>,
    /// Transfers the network module's RDMA is doing.
    pub(crate) xfers: Vec<Xfer>,
    /// Puts by RDMA that failed, not reported yet: the target, and why.
    pub(crate) xfer_failed: Vec<(Rank, String)>,
    /// RDMA transfers completed.
    pub(crate) xfers_done: u64,
}

impl OriginWin {
    fn new(members: usize) -> Self {
        Self {
            next_req: 0,
            pending: IdMap::default(),
            refusals: Vec::new(),
            refusals_seen: 0,
            posts: IdMap::default(),
            issued: vec![0; members],
            unflushed: vec![false; members],
            xfers: Vec::new(),
            xfer_failed: Vec::new(),
            xfers_done: 0,
        }
    }

    /// Files a new request to `target` awaiting `want`; its number goes in `aux`.
    pub(crate) fn request(&mut self, target: Rank, want: Want) -> u32 {
        loop {
            // 0 means "no request"; a number still pending after a wrap is skipped.
            self.next_req = self.next_req.wrapping_add(1);
            if self.next_req != 0 && !self.pending.contains_key(&self.next_req) {
                break;
            }
        }
        self.pending.insert(
            self.next_req,
            Pending {
                target,
                want,
                got: 0,
                staged: Vec::new(),
                base: 0,
                dest: None,
                state: State::Waiting,
            },
        );
        self.next_req
    }

    /// Moves the RDMA transfers on: each one `rdma` says is complete ends its
    /// registration and, for a get, answers its request with the bytes.
    pub(crate) fn poll_xfers(&mut self, rdma: &mut dyn Rdma) {
        let mut i = 0;
        while i < self.xfers.len() {
            let done = rdma.test(self.xfers[i].op);
            if matches!(done, Ok(false)) {
                i += 1;
                continue;
            }
            let x = self.xfers.swap_remove(i);
            rdma.deregister(&x.reg);
            self.xfers_done += 1;
            match (done, x.req) {
                (Ok(_), 0) => {}
                (Err(e), 0) => self.xfer_failed.push((x.target, e.to_string())),
                (r, req) => {
                    if let Some(p) = self.pending.get_mut(&req) {
                        if r.is_ok() {
                            p.got = x.buf.len();
                            p.base = 0;
                            p.staged = x.buf;
                            p.state = State::Done;
                        } else {
                            p.state = State::Broken("an RDMA read failed");
                        }
                    }
                }
            }
        }
    }

    /// Whether request `req` is answered (or failed).
    pub(crate) fn is_over(&self, req: u32) -> bool {
        self.pending.get(&req).is_none_or(|p| p.state != State::Waiting)
    }

    fn answer(&mut self, src: Rank, req: u32, msg: Msg<'_>) -> bool {
        let Some(p) = self.pending.get_mut(&req) else {
            return false;
        };
        if p.target != src || p.state != State::Waiting {
            return false;
        }
        p.state = match (p.want, msg) {
            (Want::Data(n), Msg::Result { offset, data }) => {
                if offset != p.got as u64 || p.got + data.len() > n {
                    State::Broken("bytes out of order or beyond what was asked for")
                } else {
                    match p.dest {
                        // SAFETY: the origin lent a buffer of the request's `n` bytes for
                        // the wait that is polling now; `got + len <= n` was checked.
                        Some(Dest(ptr)) => unsafe {
                            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.add(p.got), data.len())
                        },
                        None => {
                            if p.staged.is_empty() {
                                p.base = p.got;
                            }
                            p.staged.extend_from_slice(data);
                        }
                    }
                    p.got += data.len();
                    if p.got == n { State::Done } else { State::Waiting }
                }
            }
            (Want::Grant, Msg::Grant) | (Want::Ack, Msg::Ack) => State::Done,
            (_, Msg::Err { why, disp, len }) => State::Refused(why.unwrap_or(Refusal::Malformed), disp, len),
            _ => State::Broken("an answer of the wrong kind"),
        };
        true
    }
}

/// A window registered here: both sides, and what keeps its memory alive.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) target: TargetWin,
    pub(crate) origin: OriginWin,
    /// Held, never read: the memory the target serves lives as long as this.
    pub(crate) _keep: Vec<Keep>,
    /// Memory attached to a dynamic window, by address, to give back on detach.
    pub(crate) attached: HashMap<u64, Box<dyn Any + Send>>,
    /// Post, start, complete and wait so far.
    pub(crate) pscw: Pscw,
}

/// The counts of post, start, complete and wait, all of them since the window was made,
/// so that epochs follow each other without resetting anything.
#[derive(Debug, Default)]
pub(crate) struct Pscw {
    /// Origins of our posts that signal completion in the window file.
    pub(crate) shm_posted: u32,
    /// Origins of our posts that signal completion by messages.
    pub(crate) am_posted: u64,
    /// Our starts towards each member (communicator rank).
    pub(crate) started: IdMap<u32, u32>,
}

/// The one-sided protocol's state in one process.
pub(crate) struct Rma {
    wins: IdMap<u32, Slot>,
    /// The next window number this process would propose.
    pub(crate) next_id: u32,
    /// The largest payload to each rank.
    max_to: Vec<usize>,
    /// Puts and gets of at least this many bytes to a member reached by RDMA use it
    /// (`NEMESIS_RMA_RDMA_MIN`); smaller ones go as packets.
    pub(crate) rdma_min: usize,
    rank: Rank,
    /// Packets for windows not here, answers to no request, malformed packets.
    strays: u64,
    /// RDMA transfers of windows since freed.
    xfers_retired: u64,
    /// Atomics the card ran for this process's operations.
    pub(crate) card_atomics: u64,
}

impl std::fmt::Debug for Rma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rma")
            .field("windows", &self.wins.len())
            .field("strays", &self.strays)
            .finish_non_exhaustive()
    }
}

impl Rma {
    pub(crate) fn new(rank: Rank, max_to: Vec<usize>, rdma_min: usize) -> Self {
        Self {
            wins: IdMap::default(),
            next_id: 1,
            max_to,
            rdma_min,
            rank,
            strays: 0,
            xfers_retired: 0,
            card_atomics: 0,
        }
    }

    /// Registers window `id` with `members` members over `mem`.
    pub(crate) fn add(&mut self, id: u32, members: usize, target: TargetWin, keep: Vec<Keep>) {
        self.wins.insert(
            id,
            Slot {
                target,
                origin: OriginWin::new(members),
                _keep: keep,
                attached: HashMap::new(),
                pscw: Pscw::default(),
            },
        );
    }

    pub(crate) fn remove(&mut self, id: u32) -> Option<Slot> {
        let s = self.wins.remove(&id);
        self.xfers_retired += s.as_ref().map_or(0, |s| s.origin.xfers_done);
        s
    }

    pub(crate) fn slot(&self, id: u32) -> Option<&Slot> {
        self.wins.get(&id)
    }

    pub(crate) fn slot_mut(&mut self, id: u32) -> Option<&mut Slot> {
        self.wins.get_mut(&id)
    }

    /// RDMA transfers completed, over every window.
    pub(crate) fn xfers_done(&self) -> u64 {
        self.wins.values().map(|s| s.origin.xfers_done).sum::<u64>() + self.xfers_retired
    }

    /// Packets that named no window or request here, or were malformed.
    pub(crate) fn strays(&self) -> u64 {
        self.strays
    }

    #[cold]
    fn stray(&mut self, src: Rank, what: &str) {
        self.strays += 1;
        if self.strays.is_power_of_two() {
            eprintln!(
                "nemesis: rank {} dropped {} one-sided packet(s) that fit nothing here (the last from rank {src}: {what})",
                self.rank, self.strays
            );
        }
    }
}

impl Protocol for Rma {
    fn handle(&mut self, p: Packet<'_>, out: &mut Outbox) {
        let kind = p.header.kind as u8;
        let h = p.header;
        let refuse = |out: &mut Outbox, why: Refusal| {
            // A request that expects an answer gets a refusal, so its origin does not wait
            // for ever; the others are counted by their origin's flush or fence.
            if matches!(
                kind,
                wire::PUT
                    | wire::PUTV
                    | wire::GET
                    | wire::GETV
                    | wire::ACC
                    | wire::GACC
                    | wire::CAS
                    | wire::LOCK
                    | wire::UNLOCK
                    | wire::FLUSH
            ) {
                let e = Header {
                    kind: ProtocolId::RMA.kind(wire::ERR),
                    context: h.context,
                    aux: h.aux,
                    ..Header::default()
                };
                out.push_vec(p.src, e, wire::err(why, 0, 0).to_vec());
            }
        };
        let msg = match wire::decode(kind, &h, p.payload) {
            Ok(m) => m,
            Err(e) => {
                self.stray(p.src, &e.to_string());
                refuse(out, Refusal::Malformed);
                return;
            }
        };
        let max_reply = self.max_to.get(p.src as usize).copied().unwrap_or(0);
        let Some(slot) = self.wins.get_mut(&h.context) else {
            self.stray(p.src, "a window this process does not have");
            refuse(out, Refusal::UnknownWindow);
            return;
        };
        match msg {
            Msg::Post => *slot.origin.posts.entry(p.src).or_default() += 1,
            Msg::Err { why, disp, len } if h.aux == 0 => {
                slot.origin.refusals_seen += 1;
                slot.origin.refusals.push(Refused {
                    target: p.src,
                    why,
                    disp,
                    len,
                });
            }
            Msg::Result { .. } | Msg::Grant | Msg::Ack | Msg::Err { .. } => {
                if h.flags & wire::CREDIT_ME != 0 && matches!(msg, Msg::Result { .. }) {
                    // The target sends the next piece of a large get on this, whatever
                    // becomes of this one.
                    let c = Header {
                        kind: ProtocolId::RMA.kind(wire::CREDIT),
                        context: h.context,
                        aux: h.aux,
                        ..Header::default()
                    };
                    out.push_vec(p.src, c, Vec::new());
                }
                if !slot.origin.answer(p.src, h.aux, msg) {
                    self.stray(p.src, "an answer to no request");
                }
            }
            _ => slot
                .target
                .serve(p.src, &h, msg, max_reply, &mut |(to, mut rh, payload)| {
                    rh.kind = ProtocolId::RMA.kind(rh.kind as u8);
                    out.push_vec(to, rh, payload);
                }),
        }
    }
}

//! The target side of a window for requests that come as packets: checking what a
//! request names against the window's memory, applying it, answering it, and the FIFO
//! queue of the window's lock when the lock is served by messages.
//!
//! Nothing a packet says is trusted: a displacement and length must lie inside the
//! window (or inside one piece of attached memory, for a dynamic window), an element
//! update must be aligned and of the window's element type, and an unlock must come
//! from a holder. A request that fails a check touches no memory, is counted, and is
//! answered with a refusal, so the origin's operation fails instead of hanging.

use super::elem;
use super::idmap::IdMap;
use super::wire::{self, AccHead, Msg, Refusal};
use crate::channel::Header;
use std::collections::{BTreeMap, VecDeque};

/// The memory a target serves.
#[derive(Debug)]
pub(crate) enum Memory {
    /// One block: displacements are byte offsets into it.
    Flat {
        /// Its first byte.
        base: usize,
        /// Its length.
        len: usize,
    },
    /// Pieces the target attached: displacements are addresses inside one of them.
    Dynamic {
        /// Address to length.
        pieces: BTreeMap<u64, usize>,
    },
}

impl Memory {
    /// The address of `len` bytes at `disp`, if all of them lie inside the memory.
    fn resolve(&self, disp: u64, len: u64) -> Option<*mut u8> {
        match self {
            Memory::Flat { base, len: size } => {
                let end = disp.checked_add(len)?;
                if end > *size as u64 {
                    return None;
                }
                Some((*base as u64 + disp) as usize as *mut u8)
            }
            Memory::Dynamic { pieces } => {
                let (&start, &size) = pieces.range(..=disp).next_back()?;
                let end = disp.checked_add(len)?;
                if end > start + size as u64 {
                    return None;
                }
                Some(disp as usize as *mut u8)
            }
        }
    }
}

/// The lock of a window served by messages: who holds it, and who waits, in order.
#[derive(Debug, Default)]
pub(crate) struct Lock {
    /// The exclusive holder.
    exclusive: Option<u32>,
    /// Shared holders and how many locks each holds.
    shared: IdMap<u32, u32>,
    /// Waiting origins: rank, exclusive, request.
    queue: VecDeque<(u32, bool, u32)>,
}

impl Lock {
    fn compatible(&self, exclusive: bool) -> bool {
        self.exclusive.is_none() && (!exclusive || self.shared.is_empty())
    }

    /// Queues a request; returns the requests granted now (origin, request).
    pub(crate) fn request(&mut self, origin: u32, exclusive: bool, req: u32) -> Vec<(u32, u32)> {
        self.queue.push_back((origin, exclusive, req));
        self.advance()
    }

    /// Gives a lock back; the requests granted now, or `None` if `origin` held no such lock.
    pub(crate) fn release(&mut self, origin: u32, exclusive: bool) -> Option<Vec<(u32, u32)>> {
        if exclusive {
            if self.exclusive != Some(origin) {
                return None;
            }
            self.exclusive = None;
        } else {
            let n = self.shared.get_mut(&origin)?;
            *n -= 1;
            if *n == 0 {
                self.shared.remove(&origin);
            }
        }
        Some(self.advance())
    }

    /// Grants from the front of the queue while the head is compatible: strict FIFO,
    /// readers admitted together only when adjacent.
    fn advance(&mut self) -> Vec<(u32, u32)> {
        let mut granted = Vec::new();
        while let Some(&(origin, exclusive, req)) = self.queue.front() {
            if !self.compatible(exclusive) {
                break;
            }
            self.queue.pop_front();
            if exclusive {
                self.exclusive = Some(origin);
            } else {
                *self.shared.entry(origin).or_default() += 1;
            }
            granted.push((origin, req));
        }
        granted
    }
}

/// Pieces of large gets one origin may have in flight from this target: a get larger
/// than a packet is answered this many packets ahead of the origin's credits, so that a
/// window of large gets never piles copies up in the target's queues.
pub(crate) const GET_AHEAD: u32 = 4;

/// The large gets of one origin being answered, piece by piece.
#[derive(Debug, Default)]
pub(crate) struct Flow {
    /// Pieces sent and not yet credited.
    inflight: u32,
    jobs: VecDeque<Job>,
}

/// A large get being answered.
#[derive(Debug)]
struct Job {
    req: u32,
    addr: usize,
    len: usize,
    sent: usize,
}

/// One window as a target sees it.
#[derive(Debug)]
pub(crate) struct TargetWin {
    pub(crate) mem: Memory,
    /// The element type's tag (origins' windows must have the same).
    pub(crate) type_tag: u32,
    pub(crate) elem_size: usize,
    pub(crate) lock: Lock,
    /// Requests applied or refused so far: what a fence counts.
    pub(crate) applied: u64,
    /// Requests refused so far, by origin (world rank).
    pub(crate) refused: IdMap<u32, u64>,
    /// `COMPLETE`s received.
    pub(crate) completes: u64,
    /// Large gets being answered, by origin.
    flows: IdMap<u32, Flow>,
    /// The card runs this window's atomics and locks: requests for them by message are
    /// refused, so the CPU here never updates a word the card does.
    card: bool,
}

/// Why a request was refused: the reason, and the displacement and length it named.
type Refused = (Refusal, u64, u64);

/// A reply the target sends: to whom, its header (the kind in the low byte), payload.
pub(crate) type Reply = (u32, Header, Vec<u8>);

/// `parts` joined into one payload.
fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

impl TargetWin {
    pub(crate) fn new(mem: Memory, type_tag: u32, elem_size: usize) -> Self {
        Self {
            mem,
            type_tag,
            elem_size,
            lock: Lock::default(),
            applied: 0,
            refused: IdMap::default(),
            completes: 0,
            flows: IdMap::default(),
            card: false,
        }
    }

    /// This window's atomics and locks are the card's.
    pub(crate) fn with_card_atomics(mut self) -> Self {
        self.card = true;
        self
    }

    /// Drops the large gets being answered from memory at `addr`, `len` bytes, which is
    /// going away; returns their origins and requests, to be told.
    pub(crate) fn cancel_gets(&mut self, addr: usize, len: usize) -> Vec<(u32, u32)> {
        let mut gone = Vec::new();
        for (&origin, f) in self.flows.iter_mut() {
            f.jobs.retain(|j| {
                let inside = j.addr < addr + len && addr < j.addr + j.len;
                if inside {
                    gone.push((origin, j.req));
                }
                !inside
            });
        }
        gone
    }

    /// Sends the next pieces of `src`'s large gets while it has credit.
    fn pump(&mut self, src: u32, ctx: u32, chunk: usize, reply: &mut dyn FnMut(Reply)) {
        let Some(f) = self.flows.get_mut(&src) else { return };
        while f.inflight < GET_AHEAD {
            let Some(j) = f.jobs.front_mut() else { break };
            let n = chunk.min(j.len - j.sent);
            let mut b = Vec::with_capacity(wire::DISP_HEAD + n);
            b.extend_from_slice(&wire::disp_head(j.sent as u64));
            // SAFETY: the job's bytes were checked to lie inside the window when the get
            // came, and stay mapped while the window is registered (a detach cancels the
            // jobs on its memory first); copied raw, never borrowed.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (j.addr + j.sent) as *const u8,
                    b.as_mut_ptr().add(wire::DISP_HEAD),
                    n,
                );
                b.set_len(wire::DISP_HEAD + n);
            }
            let h = Header {
                kind: u16::from(wire::RESULT),
                flags: wire::CREDIT_ME,
                context: ctx,
                aux: j.req,
                ..Header::default()
            };
            reply((src, h, b));
            j.sent += n;
            f.inflight += 1;
            if j.sent == j.len {
                f.jobs.pop_front();
            }
        }
    }

    /// Serves request `msg` from `src` with header `h`: applies it if it passes the
    /// checks, and sends what answers it through `reply`. `max_reply` is the largest
    /// payload to `src`.
    pub(crate) fn serve(
        &mut self,
        src: u32,
        h: &Header,
        msg: Msg<'_>,
        max_reply: usize,
        reply: &mut dyn FnMut(Reply),
    ) {
        let req = h.aux;
        let answer = |k: u8| Header {
            kind: u16::from(k),
            context: h.context,
            aux: req,
            ..Header::default()
        };
        let grant = |r: u32| Header {
            kind: u16::from(wire::GRANT),
            context: h.context,
            aux: r,
            ..Header::default()
        };
        let result = match msg {
            Msg::Put { disp, data } => {
                self.applied += 1;
                self.put(disp, data)
            }
            Msg::PutV { blocks, data } => {
                self.applied += 1;
                match self.resolve_all(blocks) {
                    Err(e) => Err(e),
                    Ok(ptrs) => {
                        let mut at = 0usize;
                        for (p, len) in ptrs {
                            // SAFETY: `resolve_all` checked that every block lies inside
                            // the window; the decoder checked that the bytes cover them.
                            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(at), p, len) };
                            at += len;
                        }
                        Ok(())
                    }
                }
            }
            Msg::GetV { blocks } => {
                self.applied += 1;
                match self.resolve_all(blocks) {
                    Err(e) => Err(e),
                    Ok(ptrs) => {
                        let chunk = max_reply.saturating_sub(wire::DISP_HEAD).max(1);
                        let mut out: Vec<u8> = Vec::with_capacity(wire::DISP_HEAD + chunk);
                        let mut sent = 0usize;
                        for (p, len) in ptrs {
                            let mut off = 0;
                            while off < len {
                                if out.is_empty() {
                                    out.extend_from_slice(&wire::disp_head(sent as u64));
                                }
                                let n = (chunk + wire::DISP_HEAD - out.len()).min(len - off);
                                let at = out.len();
                                // SAFETY: as for `GET`: checked bytes of the window, copied
                                // raw, never borrowed.
                                unsafe {
                                    out.reserve(n);
                                    std::ptr::copy_nonoverlapping(p.add(off), out.as_mut_ptr().add(at), n);
                                    out.set_len(at + n);
                                }
                                off += n;
                                if out.len() == wire::DISP_HEAD + chunk {
                                    sent += chunk;
                                    reply((src, answer(wire::RESULT), std::mem::take(&mut out)));
                                }
                            }
                        }
                        if !out.is_empty() {
                            reply((src, answer(wire::RESULT), out));
                        }
                        Ok(())
                    }
                }
            }
            Msg::Get { disp, len } => {
                self.applied += 1;
                match self.mem.resolve(disp, len) {
                    None => Err((Refusal::OutOfBounds, disp, len)),
                    Some(p) if len as usize > max_reply.saturating_sub(wire::DISP_HEAD).max(1) => {
                        // A large get: answered piece by piece as the origin credits them.
                        self.flows.entry(src).or_default().jobs.push_back(Job {
                            req,
                            addr: p as usize,
                            len: len as usize,
                            sent: 0,
                        });
                        let chunk = max_reply.saturating_sub(wire::DISP_HEAD).max(1);
                        self.pump(src, h.context, chunk, reply);
                        Ok(())
                    }
                    Some(p) => {
                        let chunk = max_reply.saturating_sub(wire::DISP_HEAD).max(1);
                        let len = len as usize;
                        let mut off = 0usize;
                        loop {
                            let n = chunk.min(len - off);
                            let mut b = Vec::with_capacity(wire::DISP_HEAD + n);
                            b.extend_from_slice(&wire::disp_head(off as u64));
                            // SAFETY: `resolve` checked that the `len` bytes at `p` are the
                            // window's, which stays mapped while it is registered; they
                            // are copied as raw bytes, never borrowed, since other
                            // processes may write them meanwhile.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    p.add(off),
                                    b.as_mut_ptr().add(wire::DISP_HEAD),
                                    n,
                                );
                                b.set_len(wire::DISP_HEAD + n);
                            }
                            reply((src, answer(wire::RESULT), b));
                            off += n;
                            if off >= len {
                                break;
                            }
                        }
                        Ok(())
                    }
                }
            }
            Msg::Acc { head, .. } | Msg::Cas { head, .. } if self.card => {
                self.applied += 1;
                Err((Refusal::CardExecutes, head.disp, 0))
            }
            Msg::Lock { .. } | Msg::Unlock { .. } if self.card => Err((Refusal::CardExecutes, 0, 0)),
            Msg::Acc { head, data, fetch } => {
                self.applied += 1;
                match self.acc(head, data, fetch) {
                    Ok(old) => {
                        if fetch {
                            let chunk = max_reply.saturating_sub(wire::DISP_HEAD).max(self.elem_size);
                            let chunk = chunk / self.elem_size.max(1) * self.elem_size.max(1);
                            for (i, part) in old.chunks(chunk.max(1)).enumerate() {
                                let head = wire::disp_head((i * chunk) as u64);
                                reply((src, answer(wire::RESULT), join(&[&head, part])));
                            }
                            if old.is_empty() {
                                reply((src, answer(wire::RESULT), wire::disp_head(0).to_vec()));
                            }
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Msg::Cas { head, compare, swap } => {
                self.applied += 1;
                match self.cas(head, compare, swap) {
                    Ok(old) => {
                        reply((src, answer(wire::RESULT), join(&[&wire::disp_head(0), &old])));
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Msg::Lock { exclusive } => {
                for (o, r) in self.lock.request(src, exclusive, req) {
                    reply((o, grant(r), Vec::new()));
                }
                Ok(())
            }
            Msg::Unlock { exclusive } => match self.lock.release(src, exclusive) {
                None => Err((Refusal::NotLocked, 0, 0)),
                Some(granted) => {
                    reply((src, answer(wire::ACK), Vec::new()));
                    for (o, r) in granted {
                        reply((o, grant(r), Vec::new()));
                    }
                    Ok(())
                }
            },
            Msg::Flush => {
                reply((src, answer(wire::ACK), Vec::new()));
                Ok(())
            }
            Msg::Complete => {
                self.completes += 1;
                Ok(())
            }
            Msg::Credit => {
                if let Some(f) = self.flows.get_mut(&src) {
                    f.inflight = f.inflight.saturating_sub(1);
                }
                let chunk = max_reply.saturating_sub(wire::DISP_HEAD).max(1);
                self.pump(src, h.context, chunk, reply);
                Ok(())
            }
            // Replies and posts are the origin's business, not the target's.
            Msg::Result { .. } | Msg::Grant | Msg::Ack | Msg::Post | Msg::Err { .. } => Ok(()),
        };
        if let Err((why, disp, len)) = result {
            *self.refused.entry(src).or_default() += 1;
            reply((src, answer(wire::ERR), wire::err(why, disp, len).to_vec()));
        }
    }

    /// Every block's address and length, if all of them lie inside the window.
    fn resolve_all(&self, blocks: wire::Blocks<'_>) -> Result<Vec<(*mut u8, usize)>, Refused> {
        blocks
            .iter()
            .map(|(disp, len)| {
                self.mem.resolve(disp, len).map(|p| (p, len as usize)).ok_or((
                    Refusal::OutOfBounds,
                    disp,
                    len,
                ))
            })
            .collect()
    }

    fn put(&mut self, disp: u64, data: &[u8]) -> Result<(), Refused> {
        let len = data.len() as u64;
        let p = self
            .mem
            .resolve(disp, len)
            .ok_or((Refusal::OutOfBounds, disp, len))?;
        // SAFETY: `resolve` checked that the bytes at `p` are the window's, mapped while
        // it is registered; a packet's payload never lies inside a window.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// Checks an element update's head and finds its memory.
    fn elems(&self, head: AccHead, bytes: usize) -> Result<(*mut u8, usize), Refused> {
        let len = bytes as u64;
        let size = elem::elem_size(head.code).ok_or((Refusal::WrongType, head.disp, len))?;
        if head.tag != self.type_tag || size != self.elem_size {
            return Err((Refusal::WrongType, head.disp, len));
        }
        if bytes % size != 0 {
            return Err((Refusal::Malformed, head.disp, len));
        }
        let p = self
            .mem
            .resolve(head.disp, len)
            .ok_or((Refusal::OutOfBounds, head.disp, len))?;
        if p as usize % size != 0 {
            return Err((Refusal::Misaligned, head.disp, len));
        }
        Ok((p, size))
    }

    fn acc(&mut self, head: AccHead, data: &[u8], _fetch: bool) -> Result<Vec<u8>, Refused> {
        let op = super::AccOp::from_code(head.op).ok_or((Refusal::BadOp, head.disp, data.len() as u64))?;
        let (p, size) = self.elems(head, data.len())?;
        let mut old = vec![0u8; data.len()];
        for (i, (x, o)) in data
            .chunks_exact(size)
            .zip(old.chunks_exact_mut(size))
            .enumerate()
        {
            // SAFETY: `elems` checked that the elements lie inside the window, aligned
            // and of its type; concurrent accesses to them are this window's updates,
            // all atomic.
            unsafe { elem::update(head.code, op, p.add(i * size), x, o) }
                .map_err(|why| (why, head.disp, data.len() as u64))?;
        }
        Ok(old)
    }

    fn cas(&mut self, head: AccHead, compare: &[u8], swap: &[u8]) -> Result<Vec<u8>, Refused> {
        let (p, size) = self.elems(head, compare.len())?;
        if compare.len() != size {
            return Err((Refusal::Malformed, head.disp, compare.len() as u64));
        }
        let mut old = vec![0u8; size];
        // SAFETY: as for `acc`.
        unsafe { elem::compare_and_swap(size, p, compare, swap, &mut old) }
            .map_err(|why| (why, head.disp, size as u64))?;
        Ok(old)
    }
}

/// What the request `payload` of `kind` (with `h`'s flags and request number) does to
/// a window over `window`, of elements of `elem_size` bytes tagged `type_tag`, coming
/// from rank 1: the replies it sends, as (kind, payload). The target's checks and
/// effects on a plain buffer, for the fuzz target and tests; nothing else calls it.
#[doc(hidden)]
pub fn serve_bytes(
    window: &mut [u8],
    elem_size: usize,
    type_tag: u32,
    h: Header,
    kind: u8,
    payload: &[u8],
) -> Vec<(u8, Vec<u8>)> {
    let mut t = TargetWin::new(
        Memory::Flat {
            base: window.as_mut_ptr() as usize,
            len: window.len(),
        },
        type_tag,
        elem_size,
    );
    let mut out = Vec::new();
    if let Ok(msg) = wire::decode(kind, &h, payload) {
        t.serve(1, &h, msg, 4096, &mut |(_, rh, p)| out.push((rh.kind as u8, p)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(
        t: &mut TargetWin,
        src: u32,
        kind: u8,
        h: Header,
        payload: &[u8],
    ) -> Vec<(u32, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let msg = wire::decode(kind, &h, payload).unwrap();
        t.serve(src, &h, msg, 20, &mut |(to, h, payload)| {
            out.push((to, h.kind as u8, h.aux, payload))
        });
        out
    }

    #[test]
    fn requests_outside_the_window_touch_nothing_and_are_refused() {
        let mut mem = vec![0u64; 4];
        let base = mem.as_mut_ptr() as usize;
        let mut t = TargetWin::new(Memory::Flat { base, len: 32 }, 7, 8);
        let h = Header::default();
        let mut put = wire::disp_head(24).to_vec();
        put.extend_from_slice(&[1u8; 16]);
        let out = served(&mut t, 3, wire::PUT, h, &put);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0, out[0].1), (3, wire::ERR));
        assert_eq!(mem, [0; 4], "nothing was written");
        let mut put = wire::disp_head(u64::MAX - 3).to_vec();
        put.extend_from_slice(&[1u8; 8]);
        assert_eq!(
            served(&mut t, 3, wire::PUT, h, &put)[0].1,
            wire::ERR,
            "a wrapping end"
        );
        let head = AccHead {
            disp: 4,
            tag: 7,
            code: 8,
            op: 1,
        };
        let mut acc = wire::acc_head(head).to_vec();
        acc.extend_from_slice(&1u64.to_le_bytes());
        assert_eq!(
            served(&mut t, 3, wire::ACC, h, &acc)[0].1,
            wire::ERR,
            "misaligned"
        );
        let mut acc = wire::acc_head(AccHead {
            disp: 8,
            tag: 8,
            ..head
        })
        .to_vec();
        acc.extend_from_slice(&1u64.to_le_bytes());
        assert_eq!(
            served(&mut t, 3, wire::ACC, h, &acc)[0].1,
            wire::ERR,
            "another type"
        );
        assert_eq!(t.refused[&3], 4);
        assert_eq!(t.applied, 4);
        let mut acc = wire::acc_head(AccHead { disp: 8, ..head }).to_vec();
        acc.extend_from_slice(&5u64.to_le_bytes());
        assert!(served(&mut t, 3, wire::ACC, h, &acc).is_empty());
        assert_eq!(mem[1], 5);
        let get = Header { aux: 9, ..h };
        let out = served(&mut t, 2, wire::GET, get, &wire::get(0, 32));
        assert!(out.len() > 1, "a reply larger than a packet comes in pieces");
        let mut got = Vec::new();
        for (to, k, req, p) in out {
            assert_eq!((to, k, req), (2, wire::RESULT, 9));
            assert_eq!(u64::from_le_bytes(p[..8].try_into().unwrap()), got.len() as u64);
            got.extend_from_slice(&p[8..]);
        }
        assert_eq!(got, bytemuck::cast_slice::<u64, u8>(&mem));
    }

    #[test]
    fn a_large_get_is_answered_as_the_origin_credits_its_pieces() {
        let mut mem: Vec<u8> = (0..=255).cycle().take(200).collect();
        let base = mem.as_mut_ptr() as usize;
        let mut t = TargetWin::new(Memory::Flat { base, len: 200 }, 7, 1);
        let get = Header {
            aux: 5,
            ..Header::default()
        };
        // Pieces of 12 bytes (20 less the head): 17 of them, GET_AHEAD at first.
        let first = served(&mut t, 2, wire::GET, get, &wire::get(0, 200));
        assert_eq!(first.len(), GET_AHEAD as usize);
        let mut got: Vec<u8> = Vec::new();
        let take = |out: Vec<(u32, u8, u32, Vec<u8>)>, got: &mut Vec<u8>| {
            for (to, k, req, p) in out {
                assert_eq!((to, k, req), (2, wire::RESULT, 5));
                assert_eq!(u64::from_le_bytes(p[..8].try_into().unwrap()), got.len() as u64);
                got.extend_from_slice(&p[8..]);
            }
        };
        take(first, &mut got);
        assert!(
            served(&mut t, 3, wire::CREDIT, Header::default(), &[]).is_empty(),
            "another origin's credit"
        );
        while got.len() < 200 {
            let more = served(&mut t, 2, wire::CREDIT, Header::default(), &[]);
            assert_eq!(more.len(), 1, "one piece per credit");
            take(more, &mut got);
        }
        assert_eq!(got, mem);
        assert!(served(&mut t, 2, wire::CREDIT, Header::default(), &[]).is_empty());
        // Memory going away ends the gets still being answered from it.
        let _ = served(&mut t, 2, wire::GET, get, &wire::get(0, 200));
        assert_eq!(t.cancel_gets(base + 100, 10), [(2, 5)]);
        assert!(served(&mut t, 2, wire::CREDIT, Header::default(), &[]).is_empty());
    }

    #[test]
    fn dynamic_memory_is_reached_only_inside_an_attached_piece() {
        let mut a = vec![0u8; 16];
        let mut b = vec![0u8; 16];
        let (pa, pb) = (a.as_mut_ptr() as u64, b.as_mut_ptr() as u64);
        let mut pieces = BTreeMap::new();
        pieces.insert(pa, 16);
        pieces.insert(pb, 16);
        let m = Memory::Dynamic { pieces };
        assert!(m.resolve(pa, 16).is_some());
        assert!(m.resolve(pa + 8, 9).is_none(), "past a piece's end");
        assert!(m.resolve(pb + 15, 1).is_some());
        assert!(m.resolve(pa.min(pb) - 1, 1).is_none(), "before the first piece");
        drop((a, b));
    }

    #[test]
    fn the_lock_is_granted_in_order_and_only_its_holders_give_it_back() {
        let mut l = Lock::default();
        assert_eq!(l.request(1, false, 10), [(1, 10)]);
        assert_eq!(l.request(2, false, 20), [(2, 20)]);
        assert!(l.request(3, true, 30).is_empty());
        assert!(
            l.request(4, false, 40).is_empty(),
            "a reader behind a waiting writer waits"
        );
        assert_eq!(l.release(3, true), None, "not a holder");
        assert_eq!(l.release(1, false), Some(vec![]));
        assert_eq!(l.release(2, false), Some(vec![(3, 30)]));
        assert_eq!(l.release(3, true), Some(vec![(4, 40)]));
        assert_eq!(l.release(4, false), Some(vec![]));
        assert_eq!(l.release(4, false), None);
    }
}

//! Medium messages: longer than one packet and at most the medium limit, sent to a local
//! peer as a run of packets without a handshake (MEDIUM, then MDATA until the length is
//! reached), so a 64 KiB message costs a pipelined copy in and out rather than a round
//! trip before the data moves.
//!
//! The channel keeps a pair's packets in order and the sender puts a message's packets
//! into it back to back, so every MDATA from a source continues the one message that
//! source has under way: the receiver keeps one assembly per source. A message is
//! matched when its first packet arrives, if a receive is posted for it; otherwise it
//! is gathered aside and offered to the posted receives, then to the unexpected queue,
//! once whole. Until then nothing else from its source can arrive, so matching it late
//! keeps the order between a pair.
//!
//! Within the node a medium message may go through the buffer its two processes share
//! instead (`nemesis_shm::pairbuf`), when the sender finds it free: the MEDIUM packet
//! then carries no bytes and says so, and the sender writes the message into the buffer
//! before it sends anything else to that peer. So a later packet from the source finds
//! the whole message published, and the receiver takes it before that packet.

/// What a packet that came before the rest of a message through the pair buffer did:
/// the sender writes the whole message before it sends anything else.
pub(crate) const PAIRED_BROKEN_OFF: &str = "a medium message in the pair buffer broken off by another packet";

/// The largest medium message a receiver accepts, whatever the sender's limit: what one
/// source can make it gather aside.
pub(crate) const MEDIUM_MAX: usize = 1 << 20;

/// Where the rest of a medium message goes.
#[derive(Debug)]
pub(crate) enum Target {
    /// Straight into posted receive `id`.
    Req(u32),
    /// Aside, for a receive that is not posted yet.
    Buffer(Vec<u8>),
    /// Nowhere: its receiver let it go.
    Discard,
}

/// A medium message under way from one source.
#[derive(Debug)]
pub(crate) struct Assembly {
    pub into: Target,
    pub ctx: u32,
    pub tag: i32,
    pub total: usize,
    /// Bytes arrived so far.
    pub got: usize,
    /// Whether the bytes come through the pair buffer rather than MDATA packets.
    pub paired: bool,
}

/// The assemblies under way, one slot per world rank.
#[derive(Debug)]
pub(crate) struct Medium {
    arriving: Vec<Option<Assembly>>,
    /// How many are under way: while none is, a packet needs no look at its source.
    active: usize,
    /// The sources whose message under way comes through the pair buffer.
    paired: Vec<u32>,
    /// Messages that came through the pair buffer, for the tests.
    pub(crate) paired_taken: u64,
}

impl Medium {
    pub(crate) fn new(size: u32) -> Self {
        Self {
            arriving: (0..size).map(|_| None).collect(),
            active: 0,
            paired: Vec::new(),
            paired_taken: 0,
        }
    }

    /// Checks the first packet of a medium message of `total` bytes from `src`,
    /// carrying `first` of them.
    pub(crate) fn check_first(&self, src: u32, total: usize, first: usize) -> Result<(), String> {
        if self.arriving.get(src as usize).is_some_and(Option::is_some) {
            return Err("a medium message began before the last one ended".into());
        }
        if total > MEDIUM_MAX || first > total {
            return Err(format!(
                "a medium message of {total} bytes whose first packet holds {first}"
            ));
        }
        Ok(())
    }

    /// Starts gathering the rest of the message from `src` into `a`.
    pub(crate) fn begin(&mut self, src: u32, a: Assembly) {
        if let Some(slot) = self.arriving.get_mut(src as usize) {
            self.active += usize::from(slot.is_none());
            if a.paired {
                self.paired.push(src);
                self.paired_taken += 1;
            }
            *slot = Some(a);
        }
    }

    /// The sources whose message under way comes through the pair buffer.
    #[inline]
    pub(crate) fn paired(&self) -> &[u32] {
        &self.paired
    }

    /// Whether `src`'s message under way comes through the pair buffer.
    pub(crate) fn paired_from(&self, src: u32) -> bool {
        self.arriving
            .get(src as usize)
            .is_some_and(|a| a.as_ref().is_some_and(|a| a.paired))
    }

    /// Bytes arrived and announced of `src`'s message under way.
    pub(crate) fn progress_of(&self, src: u32) -> Option<(usize, usize)> {
        let a = self.arriving.get(src as usize)?.as_ref()?;
        Some((a.got, a.total))
    }

    /// Takes `src`'s assembly out of the counts.
    fn ended(&mut self, src: u32, a: &Assembly) {
        self.active -= 1;
        if a.paired {
            self.paired.retain(|&s| s != src);
        }
    }

    /// Messages under way, from any source: nought when none is.
    #[inline(always)]
    pub(crate) fn arriving_count(&self) -> usize {
        self.active
    }

    /// Whether `src` is in the middle of a medium message, so that any packet of the
    /// protocol from it but MDATA breaks the message off.
    #[inline(always)]
    pub(crate) fn interrupted_by(&self, src: u32) -> bool {
        self.active != 0 && self.arriving.get(src as usize).is_some_and(Option::is_some)
    }

    /// Takes out what `src` had under way, after it broke the protocol.
    #[cold]
    pub(crate) fn abandon(&mut self, src: u32) -> Option<Assembly> {
        let a = self.arriving.get_mut(src as usize)?.take()?;
        self.ended(src, &a);
        Some(a)
    }

    /// `data` arrived from `src`: returns where it goes and at what offset, and whether
    /// the message is now whole (then the assembly is taken out and returned).
    pub(crate) fn next(&mut self, src: u32, data: &[u8]) -> Result<Step, String> {
        let i = src as usize;
        let (at, total) = match self.arriving.get(i) {
            None => return Err("MDATA from a rank outside the job".into()),
            Some(None) => return Err("MDATA with no medium message under way".into()),
            Some(Some(a)) => (a.got, a.total),
        };
        if at + data.len() > total {
            return Err(format!("MDATA beyond the {total} bytes announced"));
        }
        let slot = &mut self.arriving[i];
        let a = slot.as_mut().expect("an assembly");
        a.got += data.len();
        if let Target::Buffer(v) = &mut a.into {
            v.extend_from_slice(data);
        }
        let req = match a.into {
            Target::Req(id) => Some(id),
            _ => None,
        };
        if a.got == total {
            let a = slot.take().expect("an assembly");
            self.ended(src, &a);
            return Ok(Step::Whole(a));
        }
        Ok(Step::Part(req, at))
    }
}

/// What an MDATA packet did.
#[derive(Debug)]
pub(crate) enum Step {
    /// More is to come; the bytes belong at this offset of this receive, if they go
    /// straight into one (a buffer has taken them already).
    Part(Option<u32>, usize),
    /// The message is whole (a buffer has taken the last bytes; a request has not).
    Whole(Assembly),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gather(total: usize) -> Assembly {
        Assembly {
            into: Target::Buffer(Vec::new()),
            ctx: 0,
            tag: 1,
            total,
            got: 0,
            paired: false,
        }
    }

    #[test]
    fn assembles_in_order_and_refuses_what_does_not_fit() {
        let mut m = Medium::new(3);
        assert!(m.next(1, b"x").is_err(), "MDATA with nothing under way");
        assert!(m.next(7, b"x").is_err(), "MDATA from outside the job");
        m.check_first(1, 6, 2).unwrap();
        let mut a = gather(6);
        a.got = 2;
        if let Target::Buffer(v) = &mut a.into {
            v.extend_from_slice(b"ab");
        }
        m.begin(1, a);
        assert!(m.check_first(1, 6, 2).is_err(), "a second first packet");
        assert!(matches!(m.next(1, b"cd").unwrap(), Step::Part(None, 2)));
        match m.next(1, b"ef").unwrap() {
            Step::Whole(a) => match a.into {
                Target::Buffer(v) => assert_eq!(v, b"abcdef"),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        m.check_first(1, 6, 2).unwrap();
        assert!(m.check_first(2, MEDIUM_MAX + 1, 10).is_err());
        assert!(m.check_first(2, 4, 10).is_err());
        m.begin(2, gather(4));
        assert!(m.next(2, b"12345").is_err(), "past the announced length");
        assert!(m.interrupted_by(2));
        assert!(m.abandon(2).is_some());
        assert!(!m.interrupted_by(2) && !m.interrupted_by(1));
        m.check_first(2, 4, 1).expect("a broken message is dropped");
    }

    #[test]
    fn the_paired_sources_are_those_under_way() {
        let mut m = Medium::new(4);
        let paired = |total| Assembly {
            paired: true,
            ..gather(total)
        };
        m.begin(1, paired(4));
        m.begin(3, paired(2));
        m.begin(2, gather(2));
        assert_eq!(m.paired(), &[1, 3]);
        assert!(m.paired_from(1) && !m.paired_from(2));
        assert_eq!(m.progress_of(3), Some((0, 2)));
        assert!(matches!(m.next(3, b"xy").unwrap(), Step::Whole(_)));
        assert_eq!(m.paired(), &[1]);
        assert!(m.abandon(1).is_some());
        assert!(m.paired().is_empty());
        assert!(m.interrupted_by(2), "the packet-borne message is still under way");
    }
}

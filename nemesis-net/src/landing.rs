//! Handing packets up: in place, or written straight into the receiver's buffer while
//! their payload is still arriving.
//!
//! A netmod that reads a stream (tcp) first reads a packet into a buffer of its own and
//! lends it up, and the layer above then copies the payload into the user's buffer: a
//! second copy of every byte, which for a 64 KiB message costs about a tenth of its
//! time on loopback. A sink that already knows where a packet goes can instead be
//! offered the packet as soon as its header is read ([`Sink::arriving`]) and have the
//! rest of its payload read from the socket into that place ([`Land::land`]).

use crate::Envelope;

/// Where a netmod hands what it reads.
pub trait Sink {
    /// A whole packet from `src`, lent in place.
    fn packet(&mut self, src: u32, env: &Envelope, payload: &[u8]);

    /// A packet of `len` payload bytes from `src` whose payload is still arriving. The
    /// sink may have the payload written into a buffer of its own by calling
    /// `land.land(buf)` with a `buf` of exactly `len` bytes, and returns what that call
    /// returned: `true` when the packet was delivered there (it does not come again),
    /// `false` when it was not (it comes through [`Sink::packet`] once whole, or its
    /// connection's failure is reported as any other). The default takes none.
    fn arriving(&mut self, src: u32, env: &Envelope, len: usize, land: &mut dyn Land) -> bool {
        let _ = (src, env, len, land);
        false
    }

    /// Whether the sink may take packets through [`Sink::arriving`]: a netmod may then
    /// read less at a time, so that a long packet's header comes before its payload.
    fn lands(&self) -> bool {
        false
    }
}

impl<F: FnMut(u32, &Envelope, &[u8]) + ?Sized> Sink for F {
    #[inline(always)]
    fn packet(&mut self, src: u32, env: &Envelope, payload: &[u8]) {
        self(src, env, payload)
    }
}

/// The rest of an arriving packet, offered to a [`Sink`].
pub trait Land {
    /// Writes the packet's whole payload into `buf`, waiting a short while for the bytes
    /// still to come. Returns `false`, leaving `buf` holding anything, when `buf` is not
    /// as long as the payload, when the bytes did not come in time, or when the
    /// connection failed; nothing is lost then.
    fn land(&mut self, buf: &mut [u8]) -> bool;
}

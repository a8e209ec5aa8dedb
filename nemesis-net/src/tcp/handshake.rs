//! The three messages that open a tcp connection, and what proves each.
//!
//! The acceptor speaks first, with a [`Challenge`] (a fresh nonce). The connector answers
//! with a [`Hello`]: who it is, whom it calls, its largest payload, a nonce of its own,
//! and a tag over all of that and the acceptor's nonce. The acceptor checks the tag and
//! either closes the connection without a word or answers a [`Reply`] tagged over the
//! answer and both nonces, which the connector checks in turn. The job key itself is
//! never sent; a recorded handshake answers no other challenge, and the two tags carry
//! different labels, so neither side can be used to answer the other's challenge.
//!
//! Decoding checks the shape (length, magic, reserved fields); proving checks the tag.

use crate::DropReason;
use crate::auth::{JobKey, NONCE_LEN, TAG_LEN};

/// The first bytes of every handshake message: a connection that starts otherwise is
/// not one of ours.
pub const MAGIC: [u8; 8] = *b"NEMTCP03";
/// Bytes in a [`Challenge`].
pub const CHALLENGE_LEN: usize = 8 + NONCE_LEN;
/// Bytes in a [`Hello`].
pub const HELLO_LEN: usize = 24 + NONCE_LEN + TAG_LEN;
/// Bytes in a [`Reply`].
pub const REPLY_LEN: usize = 16 + TAG_LEN;

const HELLO_LABEL: &[u8] = b"nemesis tcp hello";
const REPLY_LABEL: &[u8] = b"nemesis tcp reply";

/// What an acceptor sends as soon as it takes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// Fresh for every connection.
    pub nonce: [u8; NONCE_LEN],
}

impl Challenge {
    /// The bytes on the wire: [`MAGIC`], nonce.
    pub fn encode(&self) -> [u8; CHALLENGE_LEN] {
        let mut b = [0u8; CHALLENGE_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..].copy_from_slice(&self.nonce);
        b
    }
}

/// A challenge read from the wire (exactly [`CHALLENGE_LEN`] bytes).
///
/// # Errors
/// The reason to give up on the connection.
pub fn decode_challenge(buf: &[u8]) -> Result<Challenge, DropReason> {
    let b = exact::<CHALLENGE_LEN>(buf)?;
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&b[8..]);
    Ok(Challenge { nonce })
}

/// What a connector says once challenged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The connecting rank.
    pub from: u32,
    /// The rank it means to reach, which must be the acceptor's.
    pub to: u32,
    /// The connector's largest payload, which must equal the acceptor's.
    pub max_payload: u32,
    /// The connector's challenge to the acceptor.
    pub nonce: [u8; NONCE_LEN],
    /// [`Hello::tag_for`] of the fields above and the acceptor's challenge.
    pub tag: [u8; TAG_LEN],
}

impl Hello {
    /// A hello answering `challenge`, tagged with `key`.
    pub fn new(
        key: &JobKey,
        from: u32,
        to: u32,
        max_payload: u32,
        nonce: [u8; NONCE_LEN],
        challenge: &Challenge,
    ) -> Self {
        let mut h = Self {
            from,
            to,
            max_payload,
            nonce,
            tag: [0; TAG_LEN],
        };
        h.tag = h.tag_for(key, challenge);
        h
    }

    fn parts(&self) -> [[u8; 4]; 3] {
        [
            self.from.to_le_bytes(),
            self.to.to_le_bytes(),
            self.max_payload.to_le_bytes(),
        ]
    }

    /// The tag a holder of `key` puts on this hello in answer to `challenge`.
    pub fn tag_for(&self, key: &JobKey, challenge: &Challenge) -> [u8; TAG_LEN] {
        let [f, t, m] = self.parts();
        key.tag(HELLO_LABEL, &[&f, &t, &m, &self.nonce, &challenge.nonce])
    }

    /// Whether the hello's maker holds `key` and answered `challenge`; constant time.
    pub fn proves(&self, key: &JobKey, challenge: &Challenge) -> bool {
        let [f, t, m] = self.parts();
        key.verify(
            HELLO_LABEL,
            &[&f, &t, &m, &self.nonce, &challenge.nonce],
            &self.tag,
        )
    }

    /// The bytes on the wire: [`MAGIC`], from u32, to u32, max payload u32, reserved
    /// u32 = 0, nonce, tag.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.from.to_le_bytes());
        b[12..16].copy_from_slice(&self.to.to_le_bytes());
        b[16..20].copy_from_slice(&self.max_payload.to_le_bytes());
        b[24..24 + NONCE_LEN].copy_from_slice(&self.nonce);
        b[24 + NONCE_LEN..].copy_from_slice(&self.tag);
        b
    }
}

/// A hello read from the wire (exactly [`HELLO_LEN`] bytes); its tag is not checked.
///
/// # Errors
/// The reason to refuse the connection.
pub fn decode_hello(buf: &[u8]) -> Result<Hello, DropReason> {
    let b = exact::<HELLO_LEN>(buf)?;
    if u32_at(b, 20) != 0 {
        return Err(DropReason::Malformed);
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&b[24..24 + NONCE_LEN]);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&b[24 + NONCE_LEN..]);
    Ok(Hello {
        from: u32_at(b, 8),
        to: u32_at(b, 12),
        max_payload: u32_at(b, 16),
        nonce,
        tag,
    })
}

/// The acceptor's answer to a hello that proved itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyCode {
    /// This connection carries the two processes' traffic.
    Accepted,
    /// Another connection between the two does: close this one.
    Duplicate,
}

impl ReplyCode {
    fn wire(self) -> u32 {
        match self {
            ReplyCode::Accepted => 0,
            ReplyCode::Duplicate => 1,
        }
    }
}

/// What an acceptor answers a hello that proved itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// Accepted or not.
    pub code: ReplyCode,
    /// The acceptor's rank, which the connector checks against the card it dialed.
    pub rank: u32,
    /// [`Reply::tag_for`] of the fields above, the hello and the challenge.
    pub tag: [u8; TAG_LEN],
}

impl Reply {
    /// A reply to `hello`, which answered `challenge`, tagged with `key`.
    pub fn new(key: &JobKey, code: ReplyCode, rank: u32, hello: &Hello, challenge: &Challenge) -> Self {
        let mut r = Self {
            code,
            rank,
            tag: [0; TAG_LEN],
        };
        r.tag = r.tag_for(key, hello, challenge);
        r
    }

    fn parts(&self, hello: &Hello) -> [[u8; 4]; 3] {
        [
            self.code.wire().to_le_bytes(),
            self.rank.to_le_bytes(),
            hello.from.to_le_bytes(),
        ]
    }

    /// The tag a holder of `key` puts on this reply to `hello`.
    pub fn tag_for(&self, key: &JobKey, hello: &Hello, challenge: &Challenge) -> [u8; TAG_LEN] {
        let [c, r, f] = self.parts(hello);
        key.tag(REPLY_LABEL, &[&c, &r, &f, &hello.nonce, &challenge.nonce])
    }

    /// Whether the reply's maker holds `key` and answered `hello`; constant time.
    pub fn proves(&self, key: &JobKey, hello: &Hello, challenge: &Challenge) -> bool {
        let [c, r, f] = self.parts(hello);
        key.verify(
            REPLY_LABEL,
            &[&c, &r, &f, &hello.nonce, &challenge.nonce],
            &self.tag,
        )
    }

    /// The bytes on the wire: [`MAGIC`], code u32, rank u32, tag.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.code.wire().to_le_bytes());
        b[12..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..].copy_from_slice(&self.tag);
        b
    }
}

/// A reply read from the wire (exactly [`REPLY_LEN`] bytes); its tag is not checked.
///
/// # Errors
/// The reason to give up on the connection.
pub fn decode_reply(buf: &[u8]) -> Result<Reply, DropReason> {
    let b = exact::<REPLY_LEN>(buf)?;
    let code = match u32_at(b, 8) {
        0 => ReplyCode::Accepted,
        1 => ReplyCode::Duplicate,
        _ => return Err(DropReason::Malformed),
    };
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&b[16..]);
    Ok(Reply {
        code,
        rank: u32_at(b, 12),
        tag,
    })
}

/// `buf` as exactly `N` bytes that start with [`MAGIC`].
fn exact<const N: usize>(buf: &[u8]) -> Result<&[u8; N], DropReason> {
    let Ok(b) = <&[u8; N]>::try_from(buf) else {
        return Err(if buf.len() < N {
            DropReason::Truncated
        } else {
            DropReason::Oversized
        });
    };
    if b[..8] != MAGIC {
        return Err(DropReason::BadMagic);
    }
    Ok(b)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::KEY_LEN;
    use proptest::prelude::*;

    const KEY: JobKey = JobKey::from_bytes([3; KEY_LEN]);
    const OTHER: JobKey = JobKey::from_bytes([4; KEY_LEN]);

    fn challenge(n: u8) -> Challenge {
        Challenge {
            nonce: [n; NONCE_LEN],
        }
    }

    #[test]
    fn a_handshake_proves_the_key_both_ways() {
        let ch = challenge(1);
        let h = Hello::new(&KEY, 3, 9, 4096, [2; NONCE_LEN], &ch);
        assert!(h.proves(&KEY, &ch));
        let r = Reply::new(&KEY, ReplyCode::Accepted, 9, &h, &ch);
        assert!(r.proves(&KEY, &h, &ch));
        // Another job's key, another challenge, or a changed field: no proof.
        assert!(!h.proves(&OTHER, &ch));
        assert!(!h.proves(&KEY, &challenge(5)), "a replayed hello passed");
        for bent in [
            Hello { from: 4, ..h },
            Hello { to: 8, ..h },
            Hello { max_payload: 1, ..h },
            Hello {
                nonce: [0; NONCE_LEN],
                ..h
            },
        ] {
            assert!(!bent.proves(&KEY, &ch), "{bent:?}");
        }
        assert!(!r.proves(&OTHER, &h, &ch));
        assert!(
            !Reply {
                code: ReplyCode::Duplicate,
                ..r
            }
            .proves(&KEY, &h, &ch)
        );
        assert!(!Reply { rank: 8, ..r }.proves(&KEY, &h, &ch));
        let other_hello = Hello::new(&KEY, 3, 9, 4096, [7; NONCE_LEN], &ch);
        assert!(!r.proves(&KEY, &other_hello, &ch), "a replayed reply passed");
        // A reply's tag is not a hello's: neither side answers the other's challenge.
        let as_hello = Hello { tag: r.tag, ..h };
        assert!(!as_hello.proves(&KEY, &ch));
        // The key is not on the wire.
        let wire = [&ch.encode()[..], &h.encode()[..], &r.encode()[..]].concat();
        let key = [3u8; KEY_LEN];
        assert!(!wire.windows(8).any(|w| key.starts_with(w)));
    }

    #[test]
    fn shapes_are_checked() {
        let ch = challenge(1);
        let h = Hello::new(&KEY, 3, 9, 4096, [2; NONCE_LEN], &ch);
        assert_eq!(decode_hello(&h.encode()), Ok(h));
        assert_eq!(
            decode_hello(&h.encode()[..HELLO_LEN - 1]),
            Err(DropReason::Truncated)
        );
        assert_eq!(
            decode_hello(&[&h.encode()[..], &[0]].concat()),
            Err(DropReason::Oversized)
        );
        let mut b = h.encode();
        b[20] = 1;
        assert_eq!(decode_hello(&b), Err(DropReason::Malformed));
        b[0] ^= 0xff;
        assert_eq!(decode_hello(&b), Err(DropReason::BadMagic));
        assert_eq!(decode_challenge(&ch.encode()), Ok(ch));
        assert_eq!(
            decode_challenge(b"HTTP/1.1 400 Bad Request"),
            Err(DropReason::BadMagic)
        );
        for code in [ReplyCode::Accepted, ReplyCode::Duplicate] {
            let r = Reply::new(&KEY, code, 5, &h, &ch);
            assert_eq!(decode_reply(&r.encode()), Ok(r));
        }
        let mut b = Reply::new(&KEY, ReplyCode::Accepted, 5, &h, &ch).encode();
        b[8] = 2;
        assert_eq!(decode_reply(&b), Err(DropReason::Malformed));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode_challenge(&bytes);
            let _ = decode_hello(&bytes);
            let _ = decode_reply(&bytes);
        }

        #[test]
        fn hellos_decode_to_what_was_encoded(from in any::<u32>(), to in any::<u32>(), max in any::<u32>(), nonce in any::<[u8; NONCE_LEN]>(), tag in any::<[u8; TAG_LEN]>()) {
            let h = Hello { from, to, max_payload: max, nonce, tag };
            prop_assert_eq!(decode_hello(&h.encode()), Ok(h));
        }
    }
}

//! The job's secret and the keyed hashes that prove knowledge of it without showing it.
//!
//! Every process of a job holds the same [`JobKey`]. A connection proves membership by
//! answering a fresh challenge with HMAC-SHA-256 over the challenge and what the
//! connection claims (ranks, limits); a datagram carries a [`JobKey::token`] for its
//! ordered pair of ranks. Neither shows the key: a captured handshake is worthless for
//! any other challenge, a captured datagram for any other pair. Every label passed in is
//! distinct, so a tag made for one purpose never answers another.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// Bytes in a key.
pub const KEY_LEN: usize = 32;
/// Bytes in a tag.
pub const TAG_LEN: usize = 32;
/// Bytes in a challenge.
pub const NONCE_LEN: usize = 16;

/// A job's secret. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobKey([u8; KEY_LEN]);

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobKey(..)")
    }
}

/// Why a key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a job key is {} hexadecimal digits; this is not one", 2 * KEY_LEN)]
pub struct BadKey;

impl JobKey {
    /// A key from its bytes.
    pub const fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// A fresh key from the kernel's random source.
    ///
    /// # Errors
    /// The kernel has no randomness to give (never after early boot).
    pub fn random() -> std::io::Result<Self> {
        let mut k = [0u8; KEY_LEN];
        fill_random(&mut k)?;
        Ok(Self(k))
    }

    /// The key as lowercase hexadecimal, for a key-value space or a pipe.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads [`JobKey::to_hex`]'s form, and nothing else.
    ///
    /// # Errors
    /// [`BadKey`] for anything but exactly 64 hexadecimal digits.
    pub fn from_hex(s: &str) -> Result<Self, BadKey> {
        let s = s.as_bytes();
        if s.len() != 2 * KEY_LEN {
            return Err(BadKey);
        }
        let mut k = [0u8; KEY_LEN];
        for (i, pair) in s.chunks_exact(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16).ok_or(BadKey);
            k[i] = ((digit(pair[0])? << 4) | digit(pair[1])?) as u8;
        }
        Ok(Self(k))
    }

    fn hmac(&self, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        // HMAC takes a key of any length, so this cannot fail.
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC accepts any key length");
        // Lengths first, so that no two different sequences of parts hash alike.
        m.update(&(label.len() as u32).to_le_bytes());
        m.update(label);
        for p in parts {
            m.update(&(p.len() as u32).to_le_bytes());
            m.update(p);
        }
        m
    }

    /// The tag of `parts` under `label`.
    pub fn tag(&self, label: &[u8], parts: &[&[u8]]) -> [u8; TAG_LEN] {
        self.hmac(label, parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `parts` under `label`, in time that does not depend
    /// on where they differ.
    pub fn verify(&self, label: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        self.hmac(label, parts).verify_slice(tag).is_ok()
    }

    /// A 64-bit token for datagrams from rank `src` to rank `dst`: it admits that pair's
    /// traffic and no other, and reveals nothing of the key.
    pub fn token(&self, src: u32, dst: u32) -> u64 {
        let t = self.tag(
            b"nemesis datagram token",
            &[&src.to_le_bytes(), &dst.to_le_bytes()],
        );
        let mut first = [0u8; 8];
        first.copy_from_slice(&t[..8]);
        u64::from_le_bytes(first)
    }
}

/// A fresh challenge.
///
/// # Errors
/// As for [`JobKey::random`].
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    fill_random(&mut n)?;
    Ok(n)
}

/// Fills `buf` from `getrandom(2)`, which blocks only before the kernel's pool is ready.
fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is valid for `rest.len()` bytes of writes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_anything_else() {
        let k = JobKey::random().unwrap();
        assert_eq!(JobKey::from_hex(&k.to_hex()), Ok(k.clone()));
        assert_ne!(JobKey::random().unwrap(), k, "two draws gave the same key");
        let h = k.to_hex();
        assert_eq!(JobKey::from_hex(&h[1..]), Err(BadKey));
        assert_eq!(JobKey::from_hex(&format!("{h}0")), Err(BadKey));
        assert_eq!(JobKey::from_hex(&format!("g{}", &h[1..])), Err(BadKey));
        assert_eq!(JobKey::from_hex(&format!("+{}", &h[1..])), Err(BadKey));
        assert_eq!(JobKey::from_hex(""), Err(BadKey));
        assert!(!format!("{k:?}").contains(&h[..8]), "Debug shows the key");
    }

    #[test]
    fn tags_depend_on_key_label_and_every_part() {
        let k = JobKey::from_bytes([7; KEY_LEN]);
        let other = JobKey::from_bytes([8; KEY_LEN]);
        let t = k.tag(b"a", &[b"x", b"y"]);
        assert!(k.verify(b"a", &[b"x", b"y"], &t));
        assert!(!other.verify(b"a", &[b"x", b"y"], &t));
        assert!(!k.verify(b"b", &[b"x", b"y"], &t));
        assert!(!k.verify(b"a", &[b"xy"], &t), "parts must not run together");
        assert!(!k.verify(b"a", &[b"x", b"z"], &t));
        assert!(!k.verify(b"a", &[b"x", b"y"], &t[..31]));
        let mut bent = t;
        bent[31] ^= 1;
        assert!(!k.verify(b"a", &[b"x", b"y"], &bent));
    }

    #[test]
    fn tokens_differ_by_pair_and_direction() {
        let k = JobKey::from_bytes([1; KEY_LEN]);
        assert_eq!(k.token(1, 2), k.token(1, 2));
        assert_ne!(k.token(1, 2), k.token(2, 1));
        assert_ne!(k.token(1, 2), k.token(1, 3));
        assert_ne!(k.token(1, 2), JobKey::from_bytes([2; KEY_LEN]).token(1, 2));
    }

    #[test]
    fn nonces_are_fresh() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}

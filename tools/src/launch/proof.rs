//! How a connection to `nemesis-run`'s PMI port proves that it belongs to the job.
//!
//! The port is reachable by anyone who can reach the host, and `ps` shows it. So the
//! server speaks first, `cmd=challenge nonce=<32 hex digits>`, and answers nothing until
//! the connection replies `cmd=auth tag=<64 hex digits>`: HMAC-SHA-256, under the job's
//! secret, of the nonce. The secret is drawn per job and reaches the proxies on their
//! standard input, never on a command line; a recorded answer is worthless for any other
//! challenge. Ranks never see the secret: their proxy proves membership for them.

use nemesis::bootstrap::wire::{self, Line};
use nemesis::net::auth::{JobKey, NONCE_LEN, TAG_LEN};

const LABEL: &[u8] = b"nemesis pmi";

/// The server's first line.
pub fn challenge(nonce: &[u8; NONCE_LEN]) -> Line {
    Line::new("challenge").with("nonce", wire::hex(nonce))
}

/// The nonce of a challenge line, if it is one.
pub fn nonce_of(line: &Line) -> Option<[u8; NONCE_LEN]> {
    if line.cmd != "challenge" {
        return None;
    }
    wire::unhex(line.get("nonce")?)?.try_into().ok()
}

/// The answer to `nonce` by a holder of `secret`.
pub fn answer(secret: &JobKey, nonce: &[u8; NONCE_LEN]) -> Line {
    Line::new("auth").with("tag", wire::hex(&secret.tag(LABEL, &[nonce])))
}

/// Whether `line` is the answer to `nonce` under `secret`, compared in constant time;
/// else what is wrong with it.
pub fn check(secret: &JobKey, nonce: &[u8; NONCE_LEN], line: &Line) -> Result<(), &'static str> {
    if line.cmd != "auth" {
        return Err("it did not answer the challenge");
    }
    let tag = line
        .get("tag")
        .and_then(wire::unhex)
        .filter(|t| t.len() == TAG_LEN)
        .ok_or("its answer is not a tag")?;
    if secret.verify(LABEL, &[nonce], &tag) {
        Ok(())
    } else {
        Err("its answer is wrong: it does not hold the job's secret")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_secret_answers_and_only_its_challenge() {
        let secret = JobKey::random().unwrap();
        let n = [1u8; NONCE_LEN];
        assert_eq!(nonce_of(&challenge(&n)), Some(n));
        let a = answer(&secret, &n);
        assert_eq!(check(&secret, &n, &a), Ok(()));
        assert!(check(&JobKey::random().unwrap(), &n, &a).is_err());
        assert!(
            check(&secret, &[2; NONCE_LEN], &a).is_err(),
            "a replayed answer passed"
        );
        for bad in [
            Line::new("initack").with("pmiid", 0),
            Line::new("auth"),
            Line::new("auth").with("tag", "zz"),
            Line::new("auth").with("tag", "00"),
        ] {
            assert!(check(&secret, &n, &bad).is_err(), "{bad:?}");
        }
        assert_eq!(nonce_of(&Line::new("challenge").with("nonce", "00")), None);
        assert_eq!(nonce_of(&Line::new("set").with("nonce", wire::hex(&n))), None);
    }
}

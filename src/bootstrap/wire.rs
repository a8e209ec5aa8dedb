//! The PMI-1 wire format, shared by the client and `nemesis-run`'s server.
//!
//! One command per line, at most 1024 bytes: `cmd=NAME key=value key=value`. Tokens are
//! separated by spaces; a value runs to the next space. Neither side escapes anything, so
//! values never contain spaces, newlines or `=` signs in the key; binary data travels
//! hex-encoded.

use std::fmt::Write as _;

/// The longest line either side may send, newline included.
pub const MAX_LINE: usize = 1024;

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The command (the value of `cmd=`).
    pub cmd: String,
    /// The other `key=value` tokens, in order.
    pub fields: Vec<(String, String)>,
}

/// Why a line could not be parsed or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Longer than [`MAX_LINE`].
    #[error("a line of {0} bytes, over the PMI limit of {MAX_LINE}")]
    TooLong(usize),
    /// Not text.
    #[error("a line that is not UTF-8 text")]
    NotText,
    /// Empty, or not starting with `cmd=`.
    #[error("a line that does not start with cmd=: {0:?}")]
    NoCommand(String),
    /// A token that is not `key=value`.
    #[error("a token that is not key=value: {0:?}")]
    BadToken(String),
    /// A key or value that cannot be written on the wire.
    #[error("cannot send {what} {text:?}: it contains a space, newline or '='")]
    Unsendable {
        /// "key" or "value".
        what: &'static str,
        /// The offending text.
        text: String,
    },
}

impl Line {
    /// A line with command `cmd` and no fields.
    pub fn new(cmd: &str) -> Self {
        Self {
            cmd: cmd.to_string(),
            fields: Vec::new(),
        }
    }

    /// Adds a field.
    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.fields.push((key.to_string(), value.to_string()));
        self
    }

    /// The value of the first field named `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The line as sent, newline included; refuses what the wire cannot carry.
    pub fn encode(&self) -> Result<String, WireError> {
        let mut out = String::new();
        check("value", &self.cmd, false)?;
        let _ = write!(out, "cmd={}", self.cmd);
        for (k, v) in &self.fields {
            check("key", k, true)?;
            check("value", v, false)?;
            let _ = write!(out, " {k}={v}");
        }
        out.push('\n');
        if out.len() > MAX_LINE {
            return Err(WireError::TooLong(out.len()));
        }
        Ok(out)
    }
}

fn check(what: &'static str, text: &str, is_key: bool) -> Result<(), WireError> {
    let bad = text.is_empty() && is_key
        || text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || (is_key && c == '='));
    if bad {
        return Err(WireError::Unsendable {
            what,
            text: text.to_string(),
        });
    }
    Ok(())
}

/// Parses one line, with or without its newline.
pub fn parse(raw: &[u8]) -> Result<Line, WireError> {
    if raw.len() > MAX_LINE {
        return Err(WireError::TooLong(raw.len()));
    }
    let text = std::str::from_utf8(raw).map_err(|_| WireError::NotText)?;
    let text = text.strip_suffix('\n').unwrap_or(text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    let mut tokens = text.split(' ').filter(|t| !t.is_empty());
    let cmd = match tokens.next().and_then(|t| t.strip_prefix("cmd=")) {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => return Err(WireError::NoCommand(text.chars().take(80).collect())),
    };
    let mut fields = Vec::new();
    for t in tokens {
        match t.split_once('=') {
            Some((k, v)) if !k.is_empty() => fields.push((k.to_string(), v.to_string())),
            _ => return Err(WireError::BadToken(t.chars().take(80).collect())),
        }
    }
    Ok(Line { cmd, fields })
}

/// Lowercase hexadecimal of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The bytes of a hexadecimal string, or `None` if it is not one.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|p| u8::from_str_radix(p, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_hydra_sends() {
        let l = parse(b"cmd=get_result rc=-1 msg=key_x_not_found value=unknown\n").unwrap();
        assert_eq!(l.cmd, "get_result");
        assert_eq!(l.get("rc"), Some("-1"));
        assert_eq!(l.get("value"), Some("unknown"));
        let l = parse(b"cmd=barrier_out").unwrap();
        assert!(l.fields.is_empty());
        let l = parse(b"cmd=put kvsname=k key=-allgather-shm-1-0 value=a=b\n").unwrap();
        assert_eq!(l.get("key"), Some("-allgather-shm-1-0"));
        assert_eq!(l.get("value"), Some("a=b"));
    }

    #[test]
    fn refuses_garbage() {
        assert!(matches!(parse(b"hello"), Err(WireError::NoCommand(_))));
        assert!(matches!(parse(b""), Err(WireError::NoCommand(_))));
        assert!(matches!(parse(b"cmd= x=1"), Err(WireError::NoCommand(_))));
        assert!(matches!(parse(b"cmd=put oops"), Err(WireError::BadToken(_))));
        assert!(matches!(parse(b"cmd=put =v"), Err(WireError::BadToken(_))));
        assert!(matches!(
            parse(&[b'c', b'm', b'd', b'=', 0xff]),
            Err(WireError::NotText)
        ));
        assert!(matches!(parse(&vec![b'x'; 2000]), Err(WireError::TooLong(2000))));
    }

    #[test]
    fn encodes_and_refuses_what_cannot_travel() {
        let l = Line::new("put")
            .with("kvsname", "k")
            .with("key", "a")
            .with("value", hex(b"\x00 \n"));
        assert_eq!(l.encode().unwrap(), "cmd=put kvsname=k key=a value=00200a\n");
        assert_eq!(parse(l.encode().unwrap().as_bytes()).unwrap(), l);
        assert!(Line::new("put").with("key", "a b").encode().is_err());
        assert!(Line::new("put").with("k=y", "v").encode().is_err());
        assert!(Line::new("put").with("value", "x".repeat(2000)).encode().is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_fail_cleanly(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1200)) {
            let _ = parse(&raw);
        }

        #[test]
        fn what_we_encode_parses_back(
            cmd in "[a-z_]{1,12}",
            fields in proptest::collection::vec(("[A-Za-z0-9_/.-]{1,12}", "[!-~]{0,20}"), 0..8),
        ) {
            let mut l = Line::new(&cmd);
            for (k, v) in &fields {
                l = l.with(k, v);
            }
            let text = l.encode().unwrap();
            proptest::prop_assert_eq!(parse(text.as_bytes()).unwrap(), l);
        }
    }

    #[test]
    fn hex_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&all)).unwrap(), all);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}

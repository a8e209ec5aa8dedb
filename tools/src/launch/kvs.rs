//! The job's key-value space, as `nemesis-run` keeps it: every key is written once, by
//! the rank that owns it.
//!
//! A key's owner is the first rank to write it, except nemesis's own keys, whose names
//! say whose they are (`nem-<what>-<rank>`; `nem-key`, the network key, is rank 0's).
//! Writing a key again with the same value is allowed (a retried put); with another
//! value, or by another rank, it is refused, so no member can overwrite what another
//! published. `PMI_process_mapping` is the server's and cannot be written.

use std::collections::HashMap;

/// Longest key.
pub const MAX_KEY: usize = 64;
/// Longest value.
pub const MAX_VALUE: usize = 1024;

/// Why a put was refused; the message is what the server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutError {
    /// Empty, or longer than the limits the server advertises.
    BadSize,
    /// A key only the server writes, or a nemesis key that names no rank.
    Reserved,
    /// Another rank owns the key.
    NotOwner(u32),
    /// The key already holds another value.
    Exists,
}

impl PutError {
    /// The `msg=` of the refusal (no spaces: the wire cannot carry them).
    pub fn msg(&self) -> String {
        match self {
            PutError::BadSize => "bad_key_or_value".into(),
            PutError::Reserved => "reserved_key".into(),
            PutError::NotOwner(r) => format!("key_owned_by_rank_{r}"),
            PutError::Exists => "key_already_written".into(),
        }
    }
}

/// The served key.
pub const MAPPING: &str = "PMI_process_mapping";

/// Which rank a key belongs to by its name, if its name says: `Err` for a nemesis key
/// that names none.
fn owner_by_name(key: &str) -> Result<Option<u32>, PutError> {
    if key == "nem-key" {
        return Ok(Some(0));
    }
    let Some(rest) = key.strip_prefix("nem-") else {
        return Ok(None);
    };
    match rest.rsplit_once('-').map(|(_, n)| n.parse::<u32>()) {
        Some(Ok(r)) => Ok(Some(r)),
        _ => Err(PutError::Reserved),
    }
}

/// The space.
#[derive(Debug, Default)]
pub struct Kvs {
    /// Key → (owner, value).
    map: HashMap<String, (u32, String)>,
}

impl Kvs {
    /// `rank` writes `value` under `key`.
    pub fn put(&mut self, rank: u32, key: &str, value: &str) -> Result<(), PutError> {
        if key.is_empty() || key.len() > MAX_KEY || value.len() > MAX_VALUE {
            return Err(PutError::BadSize);
        }
        if key == MAPPING {
            return Err(PutError::Reserved);
        }
        if let Some(owner) = owner_by_name(key)?
            && owner != rank
        {
            return Err(PutError::NotOwner(owner));
        }
        match self.map.get(key) {
            Some((owner, _)) if *owner != rank => Err(PutError::NotOwner(*owner)),
            Some((_, v)) if v != value => Err(PutError::Exists),
            Some(_) => Ok(()),
            None => {
                self.map.insert(key.to_string(), (rank, value.to_string()));
                Ok(())
            }
        }
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_written_once_by_their_owner() {
        let mut k = Kvs::default();
        assert_eq!(k.put(1, "nem-host-1", "a"), Ok(()));
        assert_eq!(k.put(1, "nem-host-1", "a"), Ok(()), "a retried put");
        assert_eq!(k.put(1, "nem-host-1", "b"), Err(PutError::Exists));
        assert_eq!(k.put(0, "nem-host-1", "a"), Err(PutError::NotOwner(1)));
        assert_eq!(
            k.put(2, "nem-seg-0", "x"),
            Err(PutError::NotOwner(0)),
            "before rank 0 wrote it"
        );
        assert_eq!(k.put(3, "nem-key", "x"), Err(PutError::NotOwner(0)));
        assert_eq!(k.put(0, "nem-key", "k"), Ok(()));
        assert_eq!(k.put(0, "nem-anything", "x"), Err(PutError::Reserved));
        assert_eq!(k.put(0, MAPPING, "(vector)"), Err(PutError::Reserved));
        // Keys of other programs (MPICH's) belong to their first writer.
        assert_eq!(k.put(2, "P2-businesscard", "card"), Ok(()));
        assert_eq!(k.put(3, "P2-businesscard", "evil"), Err(PutError::NotOwner(2)));
        assert_eq!(k.put(2, "", "x"), Err(PutError::BadSize));
        assert_eq!(k.put(2, &"k".repeat(65), "x"), Err(PutError::BadSize));
        assert_eq!(k.put(2, "big", &"v".repeat(1025)), Err(PutError::BadSize));
        assert_eq!(k.get("nem-host-1"), Some("a"));
        assert_eq!(k.get("P2-businesscard"), Some("card"));
        assert_eq!(k.get("nem-seg-0"), None);
        assert!(PutError::NotOwner(4).msg().chars().all(|c| c != ' '));
    }
}

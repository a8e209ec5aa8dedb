//! `iovec` lists over the local buffer list and over a peer's buffer description.

use nemesis_shm::ring::{Seg, SegCursor};

/// Most entries one system call takes (`IOV_MAX` on Linux).
pub(crate) const IOV_MAX: usize = 1024;

/// The local pieces for the next `n` bytes from `at` (not moving it), at most
/// [`IOV_MAX`] of them; returns them and how many bytes they cover.
pub(crate) fn local(segs: &[Seg], at: SegCursor, n: usize) -> (Vec<libc::iovec>, usize) {
    let mut out = Vec::new();
    let mut covered = 0;
    let mut c = at;
    c.walk(segs, n, |p, len| {
        if out.len() < IOV_MAX {
            out.push(libc::iovec {
                iov_base: p.cast(),
                iov_len: len,
            });
            covered += len;
        }
    });
    (out, covered)
}

/// The peer's pieces for `n` bytes from byte `from` of the buffer `remote` describes, at
/// most [`IOV_MAX`] of them; returns them and how many bytes they cover.
pub(crate) fn remote(remote: &[(u64, u64)], from: usize, n: usize) -> (Vec<libc::iovec>, usize) {
    let mut out = Vec::new();
    let mut skip = from as u64;
    let mut left = n as u64;
    for &(addr, len) in remote {
        if left == 0 || out.len() == IOV_MAX {
            break;
        }
        if skip >= len {
            skip -= len;
            continue;
        }
        let take = (len - skip).min(left);
        out.push(libc::iovec {
            iov_base: (addr + skip) as usize as *mut libc::c_void,
            iov_len: take as usize,
        });
        left -= take;
        skip = 0;
    }
    (out, n - left as usize)
}

/// Moves `at` forward by `n` bytes of `segs`.
pub(crate) fn advance(segs: &[Seg], at: &mut SegCursor, n: usize) {
    at.walk(segs, n, |_, _| {});
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_asked_range_across_segments() {
        let mut a = [0u8; 10];
        let mut b = [0u8; 5];
        let segs = [Seg::of_mut(&mut a), Seg::of_mut(&mut b)];
        let mut at = SegCursor::default();
        advance(&segs, &mut at, 8);
        let (v, n) = local(&segs, at, 6);
        assert_eq!(n, 6);
        assert_eq!(v.iter().map(|i| i.iov_len).collect::<Vec<_>>(), [2, 4]);
        let (v, n) = local(&segs, at, 100);
        assert_eq!((v.len(), n), (2, 7));

        let r = [(1000, 10), (5000, 5)];
        let (v, n) = remote(&r, 8, 6);
        assert_eq!(n, 6);
        assert_eq!((v[0].iov_base as usize, v[0].iov_len), (1008, 2));
        assert_eq!((v[1].iov_base as usize, v[1].iov_len), (5000, 4));
        assert_eq!(remote(&r, 15, 4).1, 0);
    }
}

//! Single-copy transfer with cross-memory attach: one process reads
//! (`process_vm_readv`) or writes (`process_vm_writev`) the other's buffer directly.
//!
//! The kernel allows it where the caller may ptrace the target: the same user, and
//! either no Yama LSM, `kernel.yama.ptrace_scope = 0`, or scope 1 with the target having
//! named its readers. [`probe`] checks this once at start-up and, under scope 1, lets any
//! process of the same user read this one (`PR_SET_PTRACER_ANY`), which is what the
//! peers of a job need. A seccomp filter that forbids the calls is found the same way.

use crate::iov;
use crate::{LmtError, Role, Seg, Strategy, Xfer};
use std::io;

/// Most pieces a cookie may list; a message in more pieces is not offered for CMA.
pub const MAX_COOKIE_PIECES: usize = 256;

/// Whether this process may use CMA with its peers. Idempotent.
pub fn probe() -> io::Result<()> {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(s) => match s.trim() {
            "0" => {}
            "1" => {
                // SAFETY: prctl with integer arguments; no memory is passed.
                let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("kernel.yama.ptrace_scope is {other}: only 0 or 1 let processes read each other"),
                ));
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // A read of our own memory finds a filter or a kernel without the calls.
    let src = [0x5au8; 8];
    let mut dst = [0u8; 8];
    let l = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let r = libc::iovec {
        iov_base: src.as_ptr().cast_mut().cast(),
        iov_len: src.len(),
    };
    // SAFETY: both iovecs cover live local arrays of their stated lengths.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0) };
    if n != 8 || dst != src {
        return Err(if n < 0 {
            io::Error::last_os_error()
        } else {
            io::Error::other(format!("a read of our own memory moved {n} of 8 bytes"))
        });
    }
    Ok(())
}

/// Whether the kernel's copies are many times slower when the destination is a few
/// bytes ahead of the source within a page, as `rep movsb` is on some CPUs
/// (`nemesis_shm::copy`): on an AMD EPYC (family 25) guest, 64 KiB read from our own
/// memory moved at 1.2–2.0 GB/s with the destination 1 to 31 bytes ahead, and 7.3–7.7
/// otherwise. Timed here, best of three each way, 16 KiB with the destination on the
/// source's offset and 16 bytes ahead, taking about 50 µs; "slow" means more than
/// twice the time. `false` where CMA cannot be used.
pub fn skew_slows_kernel_copies() -> bool {
    const LEN: usize = 16 << 10;
    let src = vec![0x5au8; LEN + 4096];
    let mut dst = vec![0u8; LEN + 8192];
    let s = src
        .as_ptr()
        .wrapping_add(src.as_ptr().align_offset(4096).min(4096));
    let d0 = dst
        .as_mut_ptr()
        .wrapping_add(dst.as_ptr().align_offset(4096).min(4096));
    let time = |d: *mut u8| {
        let l = libc::iovec {
            iov_base: d.cast(),
            iov_len: LEN,
        };
        let r = libc::iovec {
            iov_base: s.cast_mut().cast(),
            iov_len: LEN,
        };
        let t = std::time::Instant::now();
        // SAFETY: `s` starts at most 4096 bytes into `src`, which has `LEN` more, and
        // `d` at most 4112 into `dst`, which has `LEN + 4080` more; the kernel writes
        // only through the local iovec.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0) };
        (n == LEN as isize).then(|| t.elapsed())
    };
    let (mut on, mut ahead) = (std::time::Duration::MAX, std::time::Duration::MAX);
    for _ in 0..3 {
        match (time(d0), time(d0.wrapping_add(16))) {
            (Some(a), Some(b)) => (on, ahead) = (on.min(a), ahead.min(b)),
            _ => return false,
        }
    }
    ahead > on * 2
}

/// Whether a kernel copy of the `len`-byte message from `peer`'s buffer named by
/// `cookie` into `dst` would meet that slow case: their first pieces only, which hold the
/// bulk of any usual message. `false` for a cookie that names nothing, or not `len` bytes.
pub fn meets_slow_case(peer: u32, cookie: &[u8], dst: &[Seg], len: usize) -> bool {
    let src = decode(peer, cookie, len)
        .ok()
        .and_then(|p| p.first().map(|&(addr, _)| addr as usize));
    let dst = dst.iter().find(|s| s.len > 0).map(|s| s.ptr as usize);
    match (src, dst) {
        (Some(s), Some(d)) => nemesis_shm::copy::meets_slow_case(s as *const u8, d as *const u8, len),
        _ => false,
    }
}

/// Appends the cookie describing `segs` (`len` bytes in all): a piece count, then an
/// address and a length per piece, little-endian. `false` if there are too many pieces.
pub fn encode(segs: &[Seg], cookie: &mut Vec<u8>) -> bool {
    let pieces: Vec<&Seg> = segs.iter().filter(|s| s.len > 0).collect();
    if pieces.len() > MAX_COOKIE_PIECES {
        return false;
    }
    cookie.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
    for s in pieces {
        cookie.extend_from_slice(&(s.ptr as usize as u64).to_le_bytes());
        cookie.extend_from_slice(&(s.len as u64).to_le_bytes());
    }
    true
}

/// The first `len` bytes of `segs`.
pub(crate) fn first(segs: &[Seg], len: usize) -> Vec<Seg> {
    let mut room = len;
    segs.iter()
        .map(|s| {
            let len = s.len.min(room);
            room -= len;
            Seg { ptr: s.ptr, len }
        })
        .collect()
}

/// The pieces a peer's cookie lists, checked to add up to `total`.
pub fn decode(peer: u32, cookie: &[u8], total: usize) -> Result<Vec<(u64, u64)>, LmtError> {
    let bad = |why: String| LmtError::BadCookie { peer, why };
    let n = cookie
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(|| bad("a CMA cookie shorter than its piece count".into()))?;
    if n > MAX_COOKIE_PIECES || cookie.len() != 4 + 16 * n {
        return Err(bad(format!(
            "a CMA cookie of {} bytes claims {n} pieces",
            cookie.len()
        )));
    }
    let word = |i: usize| u64::from_le_bytes(cookie[i..i + 8].try_into().expect("8 bytes"));
    let pieces: Vec<(u64, u64)> = (0..n).map(|i| (word(4 + 16 * i), word(12 + 16 * i))).collect();
    let mut sum = 0u64;
    for &(addr, len) in &pieces {
        if addr.checked_add(len).is_none() || addr > usize::MAX as u64 {
            return Err(bad(format!(
                "a piece of {len} bytes at {addr:#x} wraps the address space"
            )));
        }
        sum = sum.saturating_add(len);
    }
    if sum != total as u64 {
        return Err(bad(format!(
            "the pieces hold {sum} bytes, the message has {total}"
        )));
    }
    Ok(pieces)
}

/// Moves up to `step` more bytes of `x` between the local `bufs` and the peer's
/// pieces in `x.remote`: reads for [`Strategy::Cma`], writes for [`Strategy::CmaPut`].
///
/// # Safety
/// `bufs` must be valid for writing (a read) or reading (a write) and cover at least
/// `x.want` bytes.
pub(crate) unsafe fn step(pid: i32, x: &mut Xfer, bufs: &[Seg], step: usize) -> Result<(), LmtError> {
    let n = x.want.saturating_sub(x.done).min(step);
    if n == 0 {
        return Ok(());
    }
    if x.skip > 0 {
        iov::advance(bufs, &mut x.at, x.skip);
        x.skip = 0;
    }
    // The two lists may cover different lengths (each stops at IOV_MAX pieces): the
    // kernel moves as much as the shorter covers, and `done` advances by that.
    let (l, ln) = iov::local(bufs, x.at, n);
    let (r, rn) = iov::remote(&x.remote, x.done, n);
    if ln == 0 || rn == 0 {
        return Err(LmtError::BadCookie {
            peer: x.peer,
            why: format!("no memory left to move at byte {} of {}", x.done, x.total),
        });
    }
    // SAFETY: the local pieces are inside `bufs` (the caller's contract); the remote
    // ones are checked by the kernel against the peer's address space.
    let moved = unsafe {
        if x.strategy == Strategy::CmaPut || (x.strategy == Strategy::CmaSplit && x.role == Role::Send) {
            libc::process_vm_writev(pid, l.as_ptr(), l.len() as _, r.as_ptr(), r.len() as _, 0)
        } else {
            libc::process_vm_readv(pid, l.as_ptr(), l.len() as _, r.as_ptr(), r.len() as _, 0)
        }
    };
    if moved < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EFAULT) => LmtError::BadCookie {
                peer: x.peer,
                why: format!(
                    "the peer's buffer at byte {} of {} is not its memory",
                    x.done, x.total
                ),
            },
            Some(libc::ESRCH) => LmtError::PeerFailed {
                peer: x.peer,
                why: format!("process {pid} is gone"),
            },
            Some(libc::EPERM | libc::ENOSYS | libc::EACCES) => LmtError::NotPermitted {
                peer: x.peer,
                strategy: x.strategy,
                why: e,
            },
            _ => LmtError::Io {
                peer: x.peer,
                strategy: x.strategy,
                source: e,
            },
        });
    }
    let moved = moved as usize;
    if moved == 0 {
        return Err(LmtError::BadCookie {
            peer: x.peer,
            why: format!("the peer's buffer ends at byte {} of {}", x.done, x.total),
        });
    }
    iov::advance(bufs, &mut x.at, moved);
    x.done += moved;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(remote: Vec<(u64, u64)>, total: usize, dst: &mut [u8]) -> Result<Xfer, LmtError> {
        let mut x = Xfer::new(7, Strategy::Cma, Role::Recv, total);
        x.want = total.min(dst.len());
        x.remote = remote;
        let segs = [Seg::of_mut(dst)];
        while !x.is_complete() {
            // SAFETY: `dst` is a live local buffer of at least `want` bytes.
            unsafe { step(std::process::id() as i32, &mut x, &segs, 3000)? };
        }
        Ok(x)
    }

    #[test]
    fn a_read_through_a_cookie_moves_every_piece_in_order() {
        if let Err(e) = probe() {
            eprintln!("skipping: CMA is not permitted here: {e}");
            return;
        }
        let a: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let mut cookie = Vec::new();
        assert!(encode(&[Seg::of(&a), Seg::of(&[]), Seg::of(&b)], &mut cookie));
        let remote = decode(7, &cookie, 8000).unwrap();
        let mut dst = vec![0u8; 8000];
        get(remote.clone(), 8000, &mut dst).unwrap();
        assert_eq!(&dst[..5000], &a[..]);
        assert_eq!(&dst[5000..], &b[..]);

        // Into a shorter buffer: only what fits, and nothing past it.
        let mut short = vec![0xeeu8; 6001];
        get(remote, 8000, &mut short[..6000]).unwrap();
        assert_eq!(&short[5000..6000], &b[..1000]);
        assert_eq!(short[6000], 0xee);
    }

    #[test]
    fn cookies_that_lie_are_refused() {
        let a = [1u8; 100];
        let mut cookie = Vec::new();
        encode(&[Seg::of(&a)], &mut cookie);
        let e = decode(3, &cookie, 99).unwrap_err();
        assert!(matches!(e, LmtError::BadCookie { peer: 3, .. }), "{e}");
        assert!(
            e.to_string().contains("hold 100 bytes, the message has 99"),
            "{e}"
        );
        assert!(decode(3, &cookie[..10], 100).is_err());
        assert!(decode(3, &[], 0).is_err());
        let mut wrap = 1u32.to_le_bytes().to_vec();
        wrap.extend_from_slice(&u64::MAX.to_le_bytes());
        wrap.extend_from_slice(&2u64.to_le_bytes());
        assert!(decode(3, &wrap, 2).is_err());
    }

    #[test]
    fn memory_the_peer_does_not_own_is_a_bad_cookie_not_a_crash() {
        if probe().is_err() {
            return;
        }
        // The zero page is never mapped.
        let mut dst = vec![0u8; 64];
        let e = get(vec![(4096, 64)], 64, &mut dst).unwrap_err();
        assert!(matches!(e, LmtError::BadCookie { peer: 7, .. }), "{e}");
        assert!(dst.iter().all(|&b| b == 0));
    }
}

//! Accumulate operations and the element types they apply to, executed as CPU atomics
//! on window memory (see [`nemesis_shm::window::atomic`]).
//!
//! Elements are named by [`Reducible::TYPE_CODE`](crate::Reducible::TYPE_CODE), so a
//! target applies an update that came as a packet with the same code the origin would
//! have run itself on mapped memory: every update of a window, wherever it comes from,
//! is the same atomic instruction or compare-and-swap loop. Elements travel in native
//! byte order; every rank of a job runs the same build.

use super::wire::Refusal;
use crate::op::Op;
use nemesis_shm::variant::Sound;
use nemesis_shm::window::atomic::{Update, apply};
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64};

/// What an accumulate does to each target element `w` with the origin's element `x`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccOp {
    /// `w + x` (wrapping for integers).
    Sum,
    /// `w * x` (wrapping for integers).
    Prod,
    /// The smaller.
    Min,
    /// The larger.
    Max,
    /// `w & x` (integers only).
    BitAnd,
    /// `w | x` (integers only).
    BitOr,
    /// `w ^ x` (integers only).
    BitXor,
    /// `x`: an atomic write.
    Replace,
    /// `w`, unchanged: with a fetch, an atomic read.
    NoOp,
}

impl AccOp {
    /// The operation's code on the wire.
    pub fn code(self) -> u8 {
        self as u8 + 1
    }

    /// The operation of a code from the wire.
    pub fn from_code(c: u8) -> Option<Self> {
        use AccOp::*;
        [Sum, Prod, Min, Max, BitAnd, BitOr, BitXor, Replace, NoOp]
            .get(usize::from(c).checked_sub(1)?)
            .copied()
    }
}

impl From<Op> for AccOp {
    fn from(op: Op) -> Self {
        match op {
            Op::Sum => AccOp::Sum,
            Op::Prod => AccOp::Prod,
            Op::Min => AccOp::Min,
            Op::Max => AccOp::Max,
            Op::BitAnd => AccOp::BitAnd,
            Op::BitOr => AccOp::BitOr,
            Op::BitXor => AccOp::BitXor,
        }
    }
}

/// The size of the element type of `code`, if it is one.
pub(crate) fn elem_size(code: u8) -> Option<usize> {
    Some(match code {
        1 | 5 => 1,
        2 | 6 => 2,
        3 | 7 | 9 => 4,
        4 | 8 | 10 => 8,
        11 | 12 => size_of::<usize>(),
        _ => return None,
    })
}

/// Applies `op` with operand `x` to the element of type `code` at `p`, and writes what
/// it held before to `old` (all three of the element's size).
///
/// # Safety
/// `p` must point at an element of that size, aligned to it, inside memory that stays
/// mapped for the call, and every concurrent access to it must be atomic (MPI's rule
/// for accumulates: concurrent updates of one location use the same element type).
pub(crate) unsafe fn update(
    code: u8,
    op: AccOp,
    p: *mut u8,
    x: &[u8],
    old: &mut [u8],
) -> Result<(), Refusal> {
    macro_rules! int {
        ($s:ty, $u:ty, $a:ty) => {{
            let x = <$u>::from_ne_bytes(x.try_into().map_err(|_| Refusal::Malformed)?);
            let u = match op {
                AccOp::Sum => Update::Add(x),
                AccOp::Prod => Update::With(|w: $u, x: $u| (w as $s).wrapping_mul(x as $s) as $u, x),
                AccOp::Min => Update::With(|w: $u, x: $u| (w as $s).min(x as $s) as $u, x),
                AccOp::Max => Update::With(|w: $u, x: $u| (w as $s).max(x as $s) as $u, x),
                AccOp::BitAnd => Update::And(x),
                AccOp::BitOr => Update::Or(x),
                AccOp::BitXor => Update::Xor(x),
                AccOp::Replace => Update::Swap(x),
                AccOp::NoOp => Update::Load,
            };
            // SAFETY: the caller's contract: aligned, mapped, accessed only atomically.
            let a = unsafe { <$a>::from_ptr(p.cast::<$u>()) };
            old.copy_from_slice(&apply::<Sound, $a>(a, u).to_ne_bytes());
            Ok(())
        }};
    }
    macro_rules! float {
        ($f:ty, $u:ty, $a:ty) => {{
            let x = <$u>::from_ne_bytes(x.try_into().map_err(|_| Refusal::Malformed)?);
            let u = match op {
                AccOp::Sum => Update::With(
                    |w: $u, x: $u| (<$f>::from_bits(w) + <$f>::from_bits(x)).to_bits(),
                    x,
                ),
                AccOp::Prod => Update::With(
                    |w: $u, x: $u| (<$f>::from_bits(w) * <$f>::from_bits(x)).to_bits(),
                    x,
                ),
                AccOp::Min => Update::With(
                    |w: $u, x: $u| <$f>::from_bits(w).min(<$f>::from_bits(x)).to_bits(),
                    x,
                ),
                AccOp::Max => Update::With(
                    |w: $u, x: $u| <$f>::from_bits(w).max(<$f>::from_bits(x)).to_bits(),
                    x,
                ),
                AccOp::Replace => Update::Swap(x),
                AccOp::NoOp => Update::Load,
                AccOp::BitAnd | AccOp::BitOr | AccOp::BitXor => return Err(Refusal::BadOp),
            };
            // SAFETY: as for the integers.
            let a = unsafe { <$a>::from_ptr(p.cast::<$u>()) };
            old.copy_from_slice(&apply::<Sound, $a>(a, u).to_ne_bytes());
            Ok(())
        }};
    }
    match code {
        1 => int!(i8, u8, AtomicU8),
        2 => int!(i16, u16, AtomicU16),
        3 => int!(i32, u32, AtomicU32),
        4 => int!(i64, u64, AtomicU64),
        5 => int!(u8, u8, AtomicU8),
        6 => int!(u16, u16, AtomicU16),
        7 => int!(u32, u32, AtomicU32),
        8 => int!(u64, u64, AtomicU64),
        9 => float!(f32, u32, AtomicU32),
        10 => float!(f64, u64, AtomicU64),
        11 => int!(i64, u64, AtomicU64),
        12 => int!(u64, u64, AtomicU64),
        _ => Err(Refusal::WrongType),
    }
}

/// Compares the element of `size` bytes at `p` with `compare` and, if equal, stores
/// `swap`; writes what it held before to `old`. Elements compare by their bits.
///
/// # Safety
/// As for [`update`].
pub(crate) unsafe fn compare_and_swap(
    size: usize,
    p: *mut u8,
    compare: &[u8],
    swap: &[u8],
    old: &mut [u8],
) -> Result<(), Refusal> {
    macro_rules! cas {
        ($u:ty, $a:ty) => {{
            let expect = <$u>::from_ne_bytes(compare.try_into().map_err(|_| Refusal::Malformed)?);
            let new = <$u>::from_ne_bytes(swap.try_into().map_err(|_| Refusal::Malformed)?);
            // SAFETY: the caller's contract: aligned, mapped, accessed only atomically.
            let a = unsafe { <$a>::from_ptr(p.cast::<$u>()) };
            old.copy_from_slice(&apply::<Sound, $a>(a, Update::Cas { expect, new }).to_ne_bytes());
            Ok(())
        }};
    }
    match size {
        1 => cas!(u8, AtomicU8),
        2 => cas!(u16, AtomicU16),
        4 => cas!(u32, AtomicU32),
        8 => cas!(u64, AtomicU64),
        _ => Err(Refusal::WrongType),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Reducible;

    fn run<T: Reducible>(w: T, op: AccOp, x: T) -> Result<(T, T), Refusal> {
        let mut cell = [0u64];
        let p = cell.as_mut_ptr().cast::<u8>();
        let n = size_of::<T>();
        // SAFETY: `cell` is 8 aligned bytes, enough for any element.
        unsafe { std::ptr::copy_nonoverlapping(bytemuck::bytes_of(&w).as_ptr(), p, n) };
        let mut old = vec![0u8; n];
        // SAFETY: as above; nothing else touches `cell`.
        unsafe { update(T::TYPE_CODE, op, p, bytemuck::bytes_of(&x), &mut old)? };
        // SAFETY: as above.
        let now = unsafe { std::slice::from_raw_parts(p, n) };
        Ok((
            bytemuck::pod_read_unaligned(&old),
            bytemuck::pod_read_unaligned(now),
        ))
    }

    #[test]
    fn every_operation_on_every_type_does_what_the_collectives_do() {
        assert_eq!(run(-5i8, AccOp::Min, 3), Ok((-5, -5)), "signed minimum");
        assert_eq!(run(250u8, AccOp::Max, 3), Ok((250, 250)), "unsigned maximum");
        assert_eq!(run(i16::MAX, AccOp::Sum, 1), Ok((i16::MAX, i16::MIN)), "wrapping");
        assert_eq!(run(-3i32, AccOp::Prod, 7), Ok((-3, -21)));
        assert_eq!(run(6u64, AccOp::BitAnd, 3), Ok((6, 2)));
        assert_eq!(run(6u32, AccOp::BitXor, 3), Ok((6, 5)));
        assert_eq!(run(1.5f64, AccOp::Sum, 2.25), Ok((1.5, 3.75)));
        assert_eq!(run(1.5f32, AccOp::Max, -2.0), Ok((1.5, 1.5)));
        assert_eq!(run(9usize, AccOp::Replace, 4), Ok((9, 4)));
        assert_eq!(run(9isize, AccOp::NoOp, 4), Ok((9, 9)));
        assert_eq!(run(1.0f64, AccOp::BitOr, 2.0), Err(Refusal::BadOp));
        for c in 1..=9 {
            assert_eq!(AccOp::from_code(c).unwrap().code(), c);
        }
        assert_eq!(AccOp::from_code(0), None);
        assert_eq!(AccOp::from_code(10), None);
        for c in 1..=12u8 {
            assert!(elem_size(c).is_some());
        }
        assert_eq!(elem_size(13), None);
    }
}

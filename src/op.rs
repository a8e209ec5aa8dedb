//! Reduction operations and the element types they apply to: shared by the two-sided
//! collectives and the one-sided accumulates (`rma::AccOp` adds replace and no-op).

use bytemuck::Pod;

/// A reduction operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Bitwise and (integers only).
    BitAnd,
    /// Bitwise or (integers only).
    BitOr,
    /// Bitwise exclusive or (integers only).
    BitXor,
}

impl Op {
    /// A small non-zero number for the wire, so ranks that disagree can be told apart.
    pub fn code(self) -> i32 {
        self as i32 + 1
    }
}

/// An operation applied to an element type it is not defined for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{op:?} is not defined for {ty}")]
pub struct OpError {
    /// The operation.
    pub op: Op,
    /// The element type's name.
    pub ty: &'static str,
}

/// An element type that reductions can combine.
pub trait Reducible: Pod {
    /// Distinguishes the type on the wire, so mismatched ranks are caught.
    const TYPE_CODE: u8;
    /// `acc[i] = acc[i] (op) other[i]`.
    ///
    /// # Errors
    /// [`OpError`] for a bitwise operation on a floating-point type.
    fn combine(op: Op, acc: &mut [Self], other: &[Self]) -> Result<(), OpError>;
}

macro_rules! int_reducible {
    ($($t:ty = $code:expr),*) => {$(
        impl Reducible for $t {
            const TYPE_CODE: u8 = $code;
            fn combine(op: Op, acc: &mut [Self], other: &[Self]) -> Result<(), OpError> {
                let f: fn($t, $t) -> $t = match op {
                    Op::Sum => <$t>::wrapping_add,
                    Op::Prod => <$t>::wrapping_mul,
                    Op::Min => std::cmp::min,
                    Op::Max => std::cmp::max,
                    Op::BitAnd => |a, b| a & b,
                    Op::BitOr => |a, b| a | b,
                    Op::BitXor => |a, b| a ^ b,
                };
                for (a, b) in acc.iter_mut().zip(other) {
                    *a = f(*a, *b);
                }
                Ok(())
            }
        }
    )*};
}

macro_rules! float_reducible {
    ($($t:ty = $code:expr),*) => {$(
        impl Reducible for $t {
            const TYPE_CODE: u8 = $code;
            fn combine(op: Op, acc: &mut [Self], other: &[Self]) -> Result<(), OpError> {
                let f: fn($t, $t) -> $t = match op {
                    Op::Sum => |a, b| a + b,
                    Op::Prod => |a, b| a * b,
                    Op::Min => <$t>::min,
                    Op::Max => <$t>::max,
                    _ => return Err(OpError { op, ty: stringify!($t) }),
                };
                for (a, b) in acc.iter_mut().zip(other) {
                    *a = f(*a, *b);
                }
                Ok(())
            }
        }
    )*};
}

int_reducible!(
    i8 = 1,
    i16 = 2,
    i32 = 3,
    i64 = 4,
    u8 = 5,
    u16 = 6,
    u32 = 7,
    u64 = 8,
    isize = 11,
    usize = 12
);
float_reducible!(f32 = 9, f64 = 10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_operations_on_floats_are_refused() {
        assert_eq!(
            f64::combine(Op::BitXor, &mut [1.0], &[2.0]),
            Err(OpError {
                op: Op::BitXor,
                ty: "f64"
            })
        );
        let mut a = [6u8];
        u8::combine(Op::BitAnd, &mut a, &[3]).unwrap();
        assert_eq!(a, [2]);
        let mut w = [u32::MAX];
        u32::combine(Op::Sum, &mut w, &[2]).unwrap();
        assert_eq!(w, [1], "integer sums wrap");
    }
}

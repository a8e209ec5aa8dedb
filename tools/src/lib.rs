//! The tools of nemesis, shared by its binaries: the launcher behind `nemesis-run` and
//! the measurement harness behind `nemesis-bench` and the criterion benches.
//!
//! This is not the library an embedder uses (that is the `nemesis` crate): it exists so
//! that the binaries, benches and tests can share code, and its API may change with them.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod launch;
pub mod measure;

//! Standard output that ends the program quietly when its reader has gone
//! (`nemesis-bench memory | head -3`), where `print!` would panic. The partners a
//! measurement starts die with their parent (a parent-death signal), so nothing is left
//! running.

use std::fmt;
use std::io::{self, Write};

/// Writes `args` to standard output. If the reader has closed the pipe, exits at once
/// with status 0: it has read all it wanted. Any other error ends the program with
/// status 1, saying why.
pub fn write(args: fmt::Arguments<'_>) {
    if let Err(e) = io::stdout().lock().write_fmt(args) {
        failed(e)
    }
}

#[cold]
fn failed(e: io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(0)
    }
    eprintln!("nemesis-bench: writing to standard output: {e}");
    std::process::exit(1)
}

/// `print!` through [`write()`].
macro_rules! out {
    ($($t:tt)*) => {
        $crate::out::write(format_args!($($t)*))
    };
}

/// `println!` through [`write()`].
macro_rules! outln {
    () => {
        $crate::out::write(format_args!("\n"))
    };
    ($($t:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($t)*)))
    };
}

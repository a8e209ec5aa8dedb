//! Every rank says who and where it is.
//!
//! ```text
//! cargo build --release --examples
//! target/release/nemesis-run -n 4 target/release/examples/hello
//! ```

use nemesis::{Channel, ShmChannel};

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for its length; gethostname NUL-terminates within it or
    // fails.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn main() {
    let ch = match ShmChannel::init() {
        Ok(ch) => ch,
        Err(e) => {
            eprintln!("hello: {e}");
            std::process::exit(1);
        }
    };
    // A peer on another node is reached through a network module, one on this node
    // through shared memory.
    let all_local = (0..ch.size()).all(|r| ch.is_local(r));
    let via = if all_local { "shm" } else { "net" };
    println!(
        "hello from rank {} of {} on {} via {via}",
        ch.rank(),
        ch.size(),
        hostname()
    );
}

//! Every rank says who and where it is, then all meet at a barrier.
//!
//! ```text
//! cargo build --release --examples
//! target/release/nemesis-run -n 4 target/release/examples/hello
//! ```

use nemesis::p2p::Locality;

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
    if std::env::args().len() > 1 {
        println!("usage: hello   (run it under nemesis-run, mpiexec or srun; it takes no arguments)");
        return;
    }
    let mut world = match nemesis::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("hello: {e}");
            std::process::exit(1);
        }
    };
    // A peer on another node is reached through a network module, one on this node
    // through shared memory.
    let remote = world.locality().contains(&Locality::Remote);
    let via = if remote { "net" } else { "shm" };
    println!(
        "hello from rank {} of {} on {} via {via}",
        world.rank(),
        world.size(),
        hostname()
    );
    let comm = world.comm();
    if let Err(e) = world.barrier(&comm) {
        eprintln!("hello: {e}");
        std::process::exit(1);
    }
}

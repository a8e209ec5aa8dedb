//! The PMI-1 line parser must never panic, and what it parses and can re-encode must
//! parse back to the same line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nemesis::bootstrap::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = wire::parse(data) {
        if let Ok(text) = line.encode() {
            assert_eq!(wire::parse(text.as_bytes()).as_ref(), Ok(&line));
        }
    }
});

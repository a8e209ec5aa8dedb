//! Shared set-up of the loom models.

#![allow(dead_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs a model with a bounded number of preemptions: `LOOM_MAX_PREEMPTIONS` when set,
/// else `default_bound`, which keeps every model to seconds or minutes.
pub fn model(default_bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(default_bound);
    }
    b.check(f);
}

/// Runs a model of a deliberately broken variant and asserts that loom rejects it, with
/// a failure whose message contains one of `expect`.
pub fn must_fail(default_bound: usize, expect: &[&str], f: impl Fn() + Sync + Send + 'static) {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(|| model(default_bound, f)));
    std::panic::set_hook(prev);
    let err = match r {
        Ok(()) => panic!("loom accepted the broken variant; the model cannot catch {expect:?}"),
        Err(e) => e,
    };
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        expect.iter().any(|e| msg.contains(e)),
        "loom failed for another reason than {expect:?}: {msg}"
    );
}

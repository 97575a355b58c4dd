//! The null engine: completes every I/O without touching a device, at once or after a fixed
//! service time. It runs the whole pipeline anywhere, measures the engine's own overhead, and
//! with a service time stands in for a device of known latency (causal timing's tests).

use std::collections::VecDeque;
use std::io;

use crate::backend::{Completion, Engine, Entered, Io, Wait};
use crate::clock::now_ns;

pub struct NullEngine {
    staged: Vec<(u64, i64)>,
    /// With a service time: I/Os submitted, as (token, result, completion time), in
    /// submission order, which is completion order since every I/O takes the same time.
    pending: VecDeque<(u64, i64, i64)>,
    service_ns: i64,
}

impl NullEngine {
    pub fn new(depth: usize) -> Self {
        Self::with_service(depth, 0)
    }

    /// Each I/O completes exactly `service_ns` after the `enter` that submits it.
    pub fn with_service(depth: usize, service_ns: i64) -> Self {
        Self { staged: Vec::with_capacity(depth), pending: VecDeque::with_capacity(depth), service_ns: service_ns.max(0) }
    }

    fn sleep_until(t: i64) {
        let left = t - now_ns();
        if left > 0 {
            std::thread::sleep(std::time::Duration::from_nanos(left as u64));
        }
    }
}

impl Engine for NullEngine {
    unsafe fn queue(&mut self, io: Io) {
        self.staged.push((io.token, io.bytes()));
    }

    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
        if self.service_ns > 0 {
            let submitted = now_ns();
            let any = !self.staged.is_empty();
            for (token, result) in self.staged.drain(..) {
                self.pending.push_back((token, result, submitted + self.service_ns));
            }
            let first = self.pending.front().map(|p| p.2);
            match (wait, first) {
                (Wait::One, Some(f)) => Self::sleep_until(f),
                (Wait::Until(t), Some(f)) => Self::sleep_until(t.min(f)),
                (Wait::Until(t), None) => Self::sleep_until(t),
                _ => {}
            }
            let now = now_ns();
            let mut reaped = 0;
            // Completion times are the model's (submission + service), not when this saw them.
            while self.pending.front().is_some_and(|p| p.2 <= now) {
                let (token, result, at) = self.pending.pop_front().expect("front");
                done(Completion { token, result, issue_ns: None, complete_ns: at });
                reaped += 1;
            }
            return Ok(Entered { reaped, submitted_ns: any.then_some(submitted), seen_ns: (reaped > 0).then_some(now) });
        }
        if self.staged.is_empty() {
            if let Wait::Until(t) = wait {
                // Nothing can complete: sleep to the deadline like a real engine would.
                Self::sleep_until(t);
            }
            return Ok(Entered::default());
        }
        // "Submitted" and complete in the same instant.
        let now = now_ns();
        let reaped = self.staged.len();
        for (token, result) in self.staged.drain(..) {
            done(Completion { token, result, issue_ns: None, complete_ns: now });
        }
        Ok(Entered { reaped, submitted_ns: Some(now), seen_ns: Some(now) })
    }
}

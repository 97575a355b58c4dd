//! The null engine: completes every I/O at once without touching a device. It runs the
//! whole pipeline anywhere, and measures the engine's own overhead.

use std::io;

use crate::backend::{Completion, Engine, Entered, Io, Wait};
use crate::clock::now_ns;

pub struct NullEngine {
    staged: Vec<(u64, i64)>,
}

impl NullEngine {
    pub fn new(depth: usize) -> Self {
        Self { staged: Vec::with_capacity(depth) }
    }
}

impl Engine for NullEngine {
    unsafe fn queue(&mut self, io: Io) {
        self.staged.push((io.token, io.bytes()));
    }

    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
        if self.staged.is_empty() {
            if let Wait::Until(t) = wait {
                // Nothing can complete: sleep to the deadline like a real engine would.
                let left = t - now_ns();
                if left > 0 {
                    std::thread::sleep(std::time::Duration::from_nanos(left as u64));
                }
            }
            return Ok(Entered::default());
        }
        // "Submitted" and complete in the same instant.
        let now = now_ns();
        let reaped = self.staged.len();
        for (token, result) in self.staged.drain(..) {
            done(Completion { token, result, issue_ns: None, complete_ns: now });
        }
        Ok(Entered { reaped, submitted_ns: Some(now) })
    }
}

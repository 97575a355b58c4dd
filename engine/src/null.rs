//! The null engine: completes every I/O at once without touching a device. It runs the
//! whole pipeline anywhere, and measures the engine's own overhead.

use std::io;

use crate::backend::{Engine, Io, Wait, OP_FLUSH};
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
    fn queue(&mut self, io: Io) {
        let result = if io.op == OP_FLUSH { 0 } else { io.len as i64 };
        self.staged.push((io.token, result));
    }

    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(u64, i64, i64)) -> io::Result<usize> {
        if self.staged.is_empty() {
            if let Wait::Until(t) = wait {
                // Nothing can complete: sleep to the deadline like a real engine would.
                let left = t - now_ns();
                if left > 0 {
                    std::thread::sleep(std::time::Duration::from_nanos(left as u64));
                }
            }
            return Ok(0);
        }
        let now = now_ns();
        let n = self.staged.len();
        for (token, result) in self.staged.drain(..) {
            done(token, result, now);
        }
        Ok(n)
    }
}

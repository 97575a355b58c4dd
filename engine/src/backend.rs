//! What every I/O engine provides: like fio's ioengine ops, a small table the core drives.
//! The core (run.rs) does pacing, accounting and errors around it, so engines stay dumb.

use std::io;

/// Operation codes, fio's order; the same numbers as `traces.schema.Op` in Python.
pub const OP_READ: u8 = 0;
pub const OP_WRITE: u8 = 1;
pub const OP_DISCARD: u8 = 2;
pub const OP_FLUSH: u8 = 3;

/// `flags` column bit that asks for a write to reach stable media (RWF_DSYNC, which O_DIRECT
/// writes to a block device turn into FUA).
pub const FLAG_FUA: u8 = 2;

/// One I/O handed to an engine. `token` comes back with its completion (it is the row).
#[derive(Clone, Copy, Debug)]
pub struct Io {
    pub token: u64,
    pub op: u8,
    pub fua: bool,
    pub offset: u64,
    pub len: u32,
    /// Where the data goes (read) or comes from (write); aligned for O_DIRECT.
    pub buf: *mut u8,
}

// SAFETY: `buf` points into the run's `Buffers`, which outlive every I/O; moving the
// description to an I/O thread is how the psync engine works.
unsafe impl Send for Io {}

/// How long `enter` may block for completions after submitting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Wait {
    /// Reap what has completed already.
    No,
    /// Block until at least one I/O completes (only when some are in flight).
    One,
    /// Block until one completes or the monotonic clock reaches this time (ns).
    Until(i64),
}

pub trait Engine: Send {
    /// Called once on the thread that will drive the engine, before the first `queue`.
    fn start(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// Stage an I/O; nothing reaches the device before the next `enter`.
    fn queue(&mut self, io: Io);
    /// Submit what was staged, wait as asked, and report every completion seen as
    /// (token, result: bytes or -errno, completion time in ns). Returns the number reaped.
    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(u64, i64, i64)) -> io::Result<usize>;
}

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

/// What an I/O does, with exactly the fields that operation needs: an unknown op code cannot
/// be represented, data I/Os carry their buffer, and a discard carries its full 64-bit length
/// (BLKDISCARD and fallocate take one), never a truncated one.
#[derive(Clone, Copy, Debug)]
pub enum IoKind {
    /// Read `len` bytes into `buf`.
    Read { buf: *mut u8, len: u32 },
    /// Write `len` bytes from `buf`; with `fua`, to stable media (RWF_DSYNC).
    Write { buf: *const u8, len: u32, fua: bool },
    /// Discard (block device) or punch a hole in (file) `len` bytes.
    Discard { len: u64 },
    /// Make written data durable (fdatasync).
    Flush,
}

/// One I/O handed to an engine. `token` comes back with its completion (it is the row).
#[derive(Clone, Copy, Debug)]
pub struct Io {
    pub token: u64,
    pub offset: u64,
    pub kind: IoKind,
}

// SAFETY: a data I/O's buffer points into the run's `Buffers`, which outlive every I/O (the
// contract of `Engine::queue`); moving the description to an I/O thread is how the psync
// engine works.
unsafe impl Send for Io {}

impl Io {
    /// What a successful I/O reports: bytes for data I/Os and discards, 0 for a flush.
    pub fn bytes(&self) -> i64 {
        match self.kind {
            IoKind::Read { len, .. } | IoKind::Write { len, .. } => len as i64,
            IoKind::Discard { len } => len as i64,
            IoKind::Flush => 0,
        }
    }
}

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

/// One finished I/O, as `enter` reports it. Times are on the monotonic clock, in ns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Completion {
    pub token: u64,
    /// Bytes transferred (0 for a successful discard or flush) or -errno.
    pub result: i64,
    /// When the I/O entered the kernel, for an engine that starts each I/O's system call
    /// itself (psync: the thread reads the clock right before pread/pwrite/ioctl); None for
    /// an engine whose submission `Entered::submitted_ns` times.
    pub issue_ns: Option<i64>,
    /// When the completion was seen.
    pub complete_ns: i64,
}

/// What one `enter` did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Entered {
    /// Completions reported.
    pub reaped: usize,
    /// When the system call that submitted every I/O staged since the last `enter` started
    /// (as psync times each I/O's own call);
    /// None when nothing was submitted here (or the engine times each I/O in its completion).
    pub submitted_ns: Option<i64>,
    /// When the completions reported were seen, if any were: the enter's last clock read,
    /// after which it only reported them. The slots they held are free from then, so a closed
    /// loop takes it as the time its next rows became due instead of reading the clock again.
    /// None for an engine whose completions are timed elsewhere (psync's threads).
    pub seen_ns: Option<i64>,
}

pub trait Engine: Send {
    /// Called once on the thread that will drive the engine, before the first `queue`.
    fn start(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Stage an I/O; nothing reaches the device before the next `enter`.
    ///
    /// # Safety
    ///
    /// For `IoKind::Read`, `buf` must be valid for writes of `len` bytes, and for
    /// `IoKind::Write` valid for reads of `len` bytes, from this call until `enter` has
    /// reported the I/O's completion or the engine has been dropped: the kernel or an I/O
    /// thread accesses the memory in between. No Rust reference to those bytes may be used
    /// meanwhile. The core (run.rs) takes every buffer from `data::Buffers`, whose methods
    /// check the length against the buffers, and drops the engine before the buffers.
    unsafe fn queue(&mut self, io: Io);

    /// Closed loop at `depth`: how many I/Os to queue at most before each `enter` (all of
    /// them by default).
    fn submit_batch(&self, depth: usize) -> usize {
        depth
    }

    /// Submit what was staged, wait as asked, and report every completion seen.
    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(Completion)) -> io::Result<Entered>;
}

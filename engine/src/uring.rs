//! The io_uring engine: one ring per run, the target as registered file 0, the read buffer
//! and the write pool as registered buffers 0 and 1, so the kernel pins them once and each
//! I/O carries only an index.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring};

use crate::backend::{Completion, Engine, Entered, Io, IoKind, Wait};
use crate::clock::now_ns;
use crate::data::Buffers;

/// `BLOCK_URING_CMD_DISCARD` = `_IO(0x12, 0)` (linux/fs.h, Linux 6.12+): an asynchronous
/// discard of [addr, addr + addr3) on a block device.
const BLOCK_URING_CMD_DISCARD: u32 = 0x12 << 8;

/// `IORING_ENTER_GETEVENTS` (linux/io_uring.h): the enter reaps (and with a minimum, waits).
const IORING_ENTER_GETEVENTS: u32 = 1;

pub struct UringEngine {
    ring: IoUring,
    fixed_buffers: bool,
    is_block: bool,
    staged: usize,
    /// Created disabled: `start` enables it on the thread that will submit.
    disabled: bool,
}

impl UringEngine {
    /// `depth` bounds the I/Os in flight, so an SQ of that size never overflows and a CQ of
    /// twice that never drops completions.
    pub fn new(fd: RawFd, depth: usize, bufs: &Buffers, is_block: bool) -> io::Result<Self> {
        let entries = (depth.max(8) as u32).next_power_of_two().min(32768);
        // DEFER_TASKRUN (Linux 6.1+): a completion from an io-wq worker is queued for our next
        // enter instead of being run as task work that interrupts or wakes the engine thread
        // each time; a sleeping engine is woken only once the completions it waits for are
        // there. It needs SINGLE_ISSUER, so the ring starts disabled and `start` enables it
        // on the engine thread. Older kernels get COOP_TASKRUN (5.19+), then neither.
        let cq = 2 * entries;
        let ring = IoUring::builder()
            .setup_r_disabled()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(cq)
            .build(entries);
        let disabled = ring.is_ok();
        let ring = ring
            .or_else(|_| IoUring::builder().setup_coop_taskrun().setup_taskrun_flag().setup_cqsize(cq).build(entries))
            .or_else(|_| IoUring::builder().setup_cqsize(cq).build(entries))?;
        ring.submitter().register_files(&[fd])?;
        let iovecs = [
            libc::iovec { iov_base: bufs.read.ptr().cast(), iov_len: bufs.read.len() },
            libc::iovec { iov_base: bufs.pool.ptr().cast(), iov_len: bufs.pool.len() },
        ];
        // SAFETY: both buffers live in `Buffers`, which the run keeps alive (and unmoved: they
        // are heap allocations) until after this ring is dropped.
        let fixed_buffers = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        Ok(Self { ring, fixed_buffers, is_block, staged: 0, disabled })
    }

    fn entry(&self, io: &Io) -> squeue::Entry {
        let fd = types::Fixed(0);
        let entry = match io.kind {
            IoKind::Read { buf, len } if self.fixed_buffers => {
                opcode::ReadFixed::new(fd, buf, len, 0).offset(io.offset).build()
            }
            IoKind::Read { buf, len } => opcode::Read::new(fd, buf, len).offset(io.offset).build(),
            IoKind::Write { buf, len, fua } => {
                let rw_flags = if fua { libc::RWF_DSYNC } else { 0 };
                if self.fixed_buffers {
                    opcode::WriteFixed::new(fd, buf, len, 1).offset(io.offset).rw_flags(rw_flags).build()
                } else {
                    opcode::Write::new(fd, buf, len).offset(io.offset).rw_flags(rw_flags).build()
                }
            }
            IoKind::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            IoKind::Discard { len } if self.is_block => {
                let mut cmd = [0u8; 16];
                cmd[..8].copy_from_slice(&len.to_ne_bytes());
                opcode::UringCmd16::new(fd, BLOCK_URING_CMD_DISCARD).addr(Some(io.offset)).cmd(cmd).build()
            }
            IoKind::Discard { len } => opcode::Fallocate::new(fd, len)
                .offset(io.offset)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
        };
        entry.user_data(io.token)
    }

    /// Submits the staged entries, with `wait_one` waiting for a completion in the same
    /// enter; returns when that enter started, if it submitted them all: the kernel has the
    /// I/Os from then on, as psync's from the start of its pread, so an I/O served inside the
    /// call (a loop device, a read of a hole) does not count its service time as lateness.
    /// EINTR (a signal), EBUSY (completions to reap first) and ETIME leave them for the next
    /// enter.
    ///
    /// The first enter also reaps what has completed (GETEVENTS with no minimum: with
    /// DEFER_TASKRUN only such an enter runs completions); the wait is a second enter, made
    /// only when that found none: fio's commit then getevents. Against one enter that submits
    /// and then sleeps, bench/floor.c's loop did 1.04x as many I/Os at QD1 on a loop device
    /// over /dev/shm (median of 31 alternating rounds; 1.20x and 2.05x in shorter series);
    /// at depth the first enter nearly always finds completions, so the second is rare.
    fn submit_staged(&mut self, wait_one: bool) -> io::Result<Option<i64>> {
        let at = now_ns();
        let ok = |r: io::Result<usize>| match r {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::ETIME)) => Ok(()),
            Err(e) => Err(e),
        };
        let staged = self.ring.submission().len() as u32;
        // SAFETY: a plain enter on our own ring: `staged` entries are in the SQ (pushed and
        // synced by `queue`), no wait, no argument.
        ok(unsafe { self.ring.submitter().enter::<libc::sigset_t>(staged, 0, IORING_ENTER_GETEVENTS, None) })?;
        self.staged = self.ring.submission().len();
        let submitted = (self.staged == 0).then_some(at);
        if wait_one && self.ring.completion().is_empty() {
            ok(self.ring.submitter().submit_and_wait(1))?;
            self.staged = self.ring.submission().len();
        }
        Ok(submitted)
    }
}

impl Engine for UringEngine {
    fn start(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.disabled) {
            self.ring.submitter().register_enable_rings()?;
        }
        Ok(())
    }

    unsafe fn queue(&mut self, io: Io) {
        let entry = self.entry(&io);
        loop {
            // SAFETY: the buffer the entry points at stays valid until its completion is
            // reaped (this function's contract), and the entry uses registered file 0.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                break;
            }
            // The core never stages more than the SQ holds; submit if it ever happens.
            if let Err(e) = self.ring.submit() {
                if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EBUSY) {
                    panic!("io_uring submit failed while the SQ was full: {e}");
                }
            }
        }
        self.staged += 1;
    }

    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
        // Staged entries go in one enter, followed by the wait for one completion when asked
        // and none came back (`submit_staged`); a timed wait is its own enter, as the entries
        // are due now and the wait may be long.
        let folded = self.staged > 0 && wait == Wait::One;
        let submitted_ns = if self.staged > 0 { self.submit_staged(folded)? } else { None };
        let pending_work = self.ring.submission().taskrun();
        let submitter = self.ring.submitter();
        let result = match wait {
            _ if folded => Ok(0),
            // A CQ peek needs no syscall, unless completions wait for us to run them (the
            // submission just made ran them).
            Wait::No if submitted_ns.is_some() || (self.staged == 0 && !pending_work) => Ok(0),
            Wait::No => submitter.submit(),
            Wait::One => submitter.submit_and_wait(1),
            Wait::Until(t) => {
                let left = t - now_ns();
                if left <= 0 {
                    submitter.submit()
                } else {
                    let ts = types::Timespec::new()
                        .sec((left / 1_000_000_000) as u64)
                        .nsec((left % 1_000_000_000) as u32);
                    submitter.submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
                }
            }
        };
        match result {
            Ok(_) => self.staged = self.ring.submission().len(),
            // ETIME: the wait timed out; EINTR: a signal; EBUSY: completions must be reaped
            // first. Whatever is still staged goes with the next enter.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)) => {
                self.staged = self.ring.submission().len()
            }
            Err(e) => return Err(e),
        }
        let now = now_ns();
        let mut reaped = 0;
        for cqe in self.ring.completion() {
            done(Completion { token: cqe.user_data(), result: cqe.result() as i64, issue_ns: None, complete_ns: now });
            reaped += 1;
        }
        Ok(Entered { reaped, submitted_ns })
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Dropping a ring frees it in a kernel worker, which releases the registered file
        // 10-30 ms later; until then a block device stays claimed (O_EXCL), and the next run
        // on it would be refused as busy. Unregistering releases it now.
        let _ = self.ring.submitter().unregister_files();
        if self.fixed_buffers {
            let _ = self.ring.submitter().unregister_buffers();
        }
    }
}

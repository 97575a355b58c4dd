//! The io_uring engine: one ring per run, the target as registered file 0, the read buffer
//! and the write pool as registered buffers 0 and 1, so the kernel pins them once and each
//! I/O carries only an index.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{opcode, squeue, types, IoUring};

use crate::backend::{Completion, Engine, Entered, Io, IoKind, Wait};
use crate::clock::now_ns;
use crate::data::Buffers;

/// `BLOCK_URING_CMD_DISCARD` = `_IO(0x12, 0)` (linux/fs.h, Linux 6.12+): an asynchronous
/// discard of [addr, addr + addr3) on a block device.
const BLOCK_URING_CMD_DISCARD: u32 = 0x12 << 8;

/// `IORING_ENTER_GETEVENTS` (linux/io_uring.h): the enter reaps (and with a minimum, waits).
const IORING_ENTER_GETEVENTS: u32 = 1;
/// `IORING_ENTER_EXT_ARG`: the argument is an `io_uring_getevents_arg` (here, a timeout).
const IORING_ENTER_EXT_ARG: u32 = 8;
/// `IORING_ENTER_REGISTERED_RING`: the fd passed is the ring's index among the calling
/// thread's registered rings (IORING_REGISTER_RING_FDS, Linux 5.18+), not a file descriptor.
const IORING_ENTER_REGISTERED_RING: u32 = 16;
/// `IORING_REGISTER_RING_FDS` and `IORING_UNREGISTER_RING_FDS` (io_uring_register opcodes).
const IORING_REGISTER_RING_FDS: libc::c_uint = 20;
const IORING_UNREGISTER_RING_FDS: libc::c_uint = 21;

/// `struct io_uring_rsrc_update` (linux/io_uring.h): one registered ring's slot.
#[repr(C)]
struct RsrcUpdate {
    offset: u32,
    resv: u32,
    data: u64,
}

pub struct UringEngine {
    ring: IoUring,
    fixed_buffers: bool,
    is_block: bool,
    staged: usize,
    /// Created disabled: `start` enables it on the thread that will submit.
    disabled: bool,
    /// The ring's index among the engine thread's registered rings (`start` registers it),
    /// which every enter passes instead of the ring's fd: the kernel then skips looking the
    /// fd up and counting a reference to it, twice per enter in a process of many threads.
    registered: Option<u32>,
    /// I/Os queued and not yet reaped.
    inflight: usize,
    poll: Poll,
}

/// How long the engine spins for a completion before it sleeps for one.
const POLL_NS: i64 = 30_000;
/// The engine polls only with this many I/Os in flight or fewer (see `Poll`).
const POLL_MAX_INFLIGHT: usize = 4;
/// Closed loop up to this depth: one I/O per enter (`submit_batch`). Measured with
/// bench/floor.c's io_uring loop, 400k 4 KiB random reads on a loop device over /dev/shm,
/// medians of the per-round ratios to the same loop submitting all the free slots at once
/// (9 alternating rounds each, session 12): QD32 1.21x (0.79-1.50; fio io_uring QD32, which
/// submits so, 1.13-1.19x), QD4 1.06x, QD128 0.92x (0.87-1.13). This engine in 4 more rounds:
/// 1.11x at QD32 (1.08-1.28), 0.98x at QD4, 0.88x at QD128.
const SUBMIT_EACH_MAX_DEPTH: usize = 32;
/// After this many polls in a row that saw nothing, polling pauses (see `Poll`).
const MAX_BACKOFF: u32 = 1024;

/// Whether to poll before sleeping in an enter for a completion, with at most
/// POLL_MAX_INFLIGHT I/Os in flight: always while polls see completions; after a poll that
/// saw none (the device is slower than POLL_NS), not for the next 1, 2, 4, ... up to
/// MAX_BACKOFF waits, so a slow device costs a spin in at most one wait of MAX_BACKOFF.
///
/// Why poll: at QD1 on a loop device over /dev/shm a thread that sleeps in every enter is
/// woken by the completion's softirq, often from the other CPU, and on this VM an idle vCPU
/// halts (cpuidle haltpoll with guest_halt_poll_ns=0), so each wake-up is a round trip through
/// the host. 4 KiB random reads at QD1 on an otherwise idle machine: bench/floor.c's loop did
/// 25.7-51.7k IOPS sleeping and 51.5-89.6k polling (7 rounds; traced once, 98.5 % of its polls
/// saw the completion, at the same CPU time per I/O, 11.9 and 12.0 us), ours 23.4-56.9k
/// before and 56.6-77.6k polling (3 rounds). Pinning the thread to its
/// CPU did less alone (37.1-51.6k), nothing consistent on top of polling (47.5-68.6k), and
/// with a CPU hog on that CPU fell to 12.8-62.3k against 31.0-101.9k unpinned: not done.
///
/// Why not deeper: a spin keeps the loop device's worker off this CPU when the scheduler has
/// queued it here, and at depth it serves many I/Os. On a machine busy with other sessions'
/// builds, the floor at QD32 did 257-285k IOPS spinning against 376-391k sleeping; at depth
/// the first enter nearly always reaps completions anyway. Calling sched_yield in the spin
/// instead hands the CPU to whatever else is runnable here for a whole slice, our own Python
/// thread included: ours at QD32 did 105-251k against 353-373k.
#[derive(Debug, Default)]
pub(crate) struct Poll {
    /// Waits left to skip, and the next pause after a miss.
    skip: u32,
    backoff: u32,
}

impl Poll {
    /// Whether to poll before this wait.
    #[inline]
    pub(crate) fn wanted(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// What a poll saw.
    #[inline]
    pub(crate) fn saw(&mut self, completion: bool) {
        if completion {
            self.backoff = 0;
        } else {
            self.backoff = (self.backoff * 2).clamp(1, MAX_BACKOFF);
            self.skip = self.backoff;
        }
    }
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
        Ok(Self { ring, fixed_buffers, is_block, staged: 0, disabled, registered: None, inflight: 0, poll: Poll::default() })
    }

    /// Registers the ring's fd with the calling thread (a registration is the thread's own,
    /// so this runs on the engine thread); None where the kernel has no IORING_REGISTER_RING_FDS.
    fn register_ring_fd(&self) -> Option<u32> {
        let mut up = RsrcUpdate { offset: u32::MAX, resv: 0, data: self.ring.as_raw_fd() as u64 };
        // SAFETY: `up` is one valid io_uring_rsrc_update the kernel reads and writes back (the
        // index it chose, in `offset`), for our own ring's fd.
        let r = unsafe {
            libc::syscall(libc::SYS_io_uring_register, self.ring.as_raw_fd(), IORING_REGISTER_RING_FDS, &mut up as *mut RsrcUpdate, 1)
        };
        (r == 1).then_some(up.offset)
    }

    /// io_uring_enter on our ring, by its registered index when it has one; `timeout` makes
    /// it an EXT_ARG enter that waits at most that long. Returns the entries submitted.
    fn enter_ring(&self, to_submit: u32, min_complete: u32, mut flags: u32, timeout: Option<&types::SubmitArgs>) -> io::Result<usize> {
        let fd = match self.registered {
            Some(index) => {
                flags |= IORING_ENTER_REGISTERED_RING;
                index as libc::c_int
            }
            None => self.ring.as_raw_fd(),
        };
        let (arg, size) = match timeout {
            Some(args) => {
                flags |= IORING_ENTER_EXT_ARG;
                (args as *const types::SubmitArgs as *const libc::c_void, std::mem::size_of::<types::SubmitArgs>())
            }
            None => (std::ptr::null(), 0),
        };
        // SAFETY: an enter on our own ring: the entries it submits were pushed and synced by
        // `queue`, and `arg`, when given, is a live io_uring_getevents_arg (SubmitArgs is
        // its transparent wrapper) whose timespec outlives the call.
        let r = unsafe { libc::syscall(libc::SYS_io_uring_enter, fd, to_submit, min_complete, flags, arg, size) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
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
        ok(self.submit_and_wait(0, None))?;
        self.staged = self.ring.submission().len();
        let submitted = (self.staged == 0).then_some(at);
        if wait_one && self.ring.completion().is_empty() {
            ok(self.wait_one())?;
            self.staged = self.ring.submission().len();
        }
        Ok(submitted)
    }

    /// Waits for one completion: spins for it first (`Poll`), then, if none came, sleeps for
    /// it in an enter (which also submits whatever is staged).
    fn wait_one(&mut self) -> io::Result<usize> {
        let shallow = self.inflight <= POLL_MAX_INFLIGHT;
        if shallow && self.ring.submission().is_empty() && self.ring.completion().is_empty() && self.poll.wanted() {
            let until = now_ns() + POLL_NS;
            let seen = loop {
                // With DEFER_TASKRUN (or COOP_TASKRUN) a completion first shows as the
                // TASKRUN flag, and reaches the CQ only in an enter.
                if self.ring.submission().taskrun() || !self.ring.completion().is_empty() {
                    break true;
                }
                if now_ns() >= until {
                    break false;
                }
                std::hint::spin_loop();
            };
            self.poll.saw(seen);
            if seen {
                return self.submit_and_wait(0, None);
            }
        }
        self.submit_and_wait(1, None)
    }

    /// One enter that submits whatever is in the SQ, runs and reaps the completions there
    /// are (GETEVENTS: with DEFER_TASKRUN only such an enter runs them) and waits for `want`
    /// of them, at most `timeout` long.
    fn submit_and_wait(&mut self, want: u32, timeout: Option<&types::SubmitArgs>) -> io::Result<usize> {
        let staged = self.ring.submission().len() as u32;
        self.enter_ring(staged, want, IORING_ENTER_GETEVENTS, timeout)
    }
}

impl Engine for UringEngine {
    /// Up to SUBMIT_EACH_MAX_DEPTH each I/O goes in an enter of its own, as fio's io_uring
    /// engine submits (iodepth_batch 1): the enter also runs and reaps the completions there
    /// are, so the slots refill one by one as the loop device's worker frees them. Deeper,
    /// all the free slots go in one enter. See SUBMIT_EACH_MAX_DEPTH for the measurements.
    fn submit_batch(&self, depth: usize) -> usize {
        if depth <= SUBMIT_EACH_MAX_DEPTH {
            1
        } else {
            depth
        }
    }

    fn start(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.disabled) {
            self.ring.submitter().register_enable_rings()?;
        }
        self.registered = self.register_ring_fd();
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
        self.inflight += 1;
    }

    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
        // Staged entries go in one enter, followed by the wait for one completion when asked
        // and none came back (`submit_staged`); a timed wait is its own enter, as the entries
        // are due now and the wait may be long.
        let folded = self.staged > 0 && wait == Wait::One;
        let submitted_ns = if self.staged > 0 { self.submit_staged(folded)? } else { None };
        let pending_work = self.ring.submission().taskrun();
        let result = match wait {
            _ if folded => Ok(0),
            // A CQ peek needs no syscall, unless completions wait for us to run them (the
            // submission just made ran them).
            Wait::No if submitted_ns.is_some() || (self.staged == 0 && !pending_work) => Ok(0),
            Wait::No => self.submit_and_wait(0, None),
            Wait::One => self.wait_one(),
            Wait::Until(t) => {
                let left = t - now_ns();
                if left <= 0 {
                    self.submit_and_wait(0, None)
                } else {
                    let ts = types::Timespec::new()
                        .sec((left / 1_000_000_000) as u64)
                        .nsec((left % 1_000_000_000) as u32);
                    self.submit_and_wait(1, Some(&types::SubmitArgs::new().timespec(&ts)))
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
        self.inflight -= reaped;
        Ok(Entered { reaped, submitted_ns, seen_ns: (reaped > 0).then_some(now) })
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Dropping a ring frees it in a kernel worker, which releases the registered file
        // 10-30 ms later; until then a block device stays claimed (O_EXCL), and the next run
        // on it would be refused as busy. Unregistering releases it now.
        if let Some(index) = self.registered {
            let up = RsrcUpdate { offset: index, resv: 0, data: 0 };
            // SAFETY: `up` names the slot `register_ring_fd` filled; the kernel only reads it.
            // Dropped on the engine thread (python.rs), whose registration it is; a thread's
            // registrations also go when it exits.
            unsafe { libc::syscall(libc::SYS_io_uring_register, self.ring.as_raw_fd(), IORING_UNREGISTER_RING_FDS, &up as *const RsrcUpdate, 1) };
        }
        let _ = self.ring.submitter().unregister_files();
        if self.fixed_buffers {
            let _ = self.ring.submitter().unregister_buffers();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::IoKind;
    use crate::data::DataPattern;
    use std::io::Write;

    /// Linux (major, minor), for the feature a test expects of the kernel.
    fn kernel() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    #[test]
    fn polling_pauses_after_a_miss_for_twice_as_many_waits_each_time() {
        let mut poll = Poll::default();
        // Polls that see completions go on at every wait.
        for _ in 0..5 {
            assert!(poll.wanted());
            poll.saw(true);
        }
        // Each miss pauses polling for 1, 2, 4, ... waits, up to MAX_BACKOFF.
        let mut pauses = Vec::new();
        for _ in 0..13 {
            assert!(poll.wanted());
            poll.saw(false);
            let mut skipped = 0;
            while !poll.wanted() {
                skipped += 1;
            }
            pauses.push(skipped);
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1024, 1024]);
        // A poll that sees a completion (the `wanted` that ended the last pause) ends the backoff.
        poll.saw(true);
        assert!(poll.wanted());
        poll.saw(false);
        assert!(!poll.wanted() && poll.wanted());
    }

    #[test]
    fn reads_through_the_registered_ring_with_every_kind_of_wait() {
        const BLOCKS: usize = 64;
        let path = std::env::temp_dir().join(format!("uring-test-{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let data: Vec<u8> = (0..BLOCKS * 4096).map(|i| (i / 4096 * 13 + i % 241) as u8).collect();
        file.write_all(&data).unwrap();
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let mut engine = match UringEngine::new(file.as_raw_fd(), 8, &bufs, false) {
            Ok(e) => e,
            Err(e) => return eprintln!("skipped: io_uring unavailable here ({e})"),
        };
        engine.start().unwrap();
        // IORING_REGISTER_RING_FDS came in Linux 5.18.
        assert_eq!(engine.registered.is_some(), kernel() >= (5, 18), "ring fd registration on Linux {:?}", kernel());
        for (k, wait) in [Wait::One, Wait::No, Wait::Until(i64::MAX)].into_iter().cycle().take(BLOCKS).enumerate() {
            let block = k * 29 % BLOCKS;
            let buf = bufs.read_destination(0, 4096);
            let io = Io { token: block as u64, offset: (block * 4096) as u64, kind: IoKind::Read { buf, len: 4096 } };
            // SAFETY: `buf` is a slot of `bufs`, which outlives the engine; the test reads it
            // only after the completion is reported.
            unsafe { engine.queue(io) };
            let wait = match wait {
                Wait::Until(_) => Wait::Until(now_ns() + 1_000_000_000),
                w => w,
            };
            let mut got = Vec::new();
            let mut entered = engine.enter(wait, &mut |c| got.push(c)).unwrap();
            while got.is_empty() {
                entered = engine.enter(Wait::One, &mut |c| got.push(c)).unwrap();
            }
            assert!(entered.reaped == 1 && got.len() == 1);
            assert_eq!((got[0].token, got[0].result), (block as u64, 4096));
            // SAFETY: the read into `buf` has completed; nothing else touches it.
            let read = unsafe { std::slice::from_raw_parts(buf, 4096) };
            assert!(read == &data[block * 4096..(block + 1) * 4096], "block {block}: wrong bytes");
        }
    }
}

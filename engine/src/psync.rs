//! The psync engine: threads doing pread/pwrite. Two uses:
//! - where io_uring is refused (Docker's default seccomp profile answers EPERM): one thread
//!   per I/O in flight, so the device sees the whole queue depth;
//! - for a driver that does each I/O on the CPU of the thread that submits it (zram, brd):
//!   io_uring cannot issue such I/O without blocking, so it would hand each one to a kernel
//!   worker thread and its completion back; here one thread per CPU runs them, the engine
//!   thread among them whenever it would otherwise wait (`inline`).
//!
//! Either way an I/O is issued when a thread starts its system call: the thread reads the clock
//! right before pread/pwrite/ioctl and again after it, and both times come back with the
//! completion. The wait in the queue before that counts as lateness, not as device latency.

use std::collections::VecDeque;
use std::io;
use std::mem;
use std::os::fd::RawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backend::{Completion, Engine, Entered, Io, IoKind, Wait};
use crate::clock::{now_ns, spawn_without_signals};

/// BLKDISCARD = _IO(0x12, 119): discard a byte range [start, start + len) of a block device.
const BLKDISCARD: libc::c_ulong = (0x12 << 8) | 119;

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Io>,
    /// Threads asleep waiting for a job.
    idle: usize,
    closed: bool,
}

#[derive(Default)]
struct Done {
    list: Vec<Completion>,
    /// The engine thread is asleep waiting for a completion.
    waiting: bool,
}

#[derive(Default)]
struct Shared {
    jobs: Mutex<Jobs>,
    work: Condvar,
    done: Mutex<Done>,
    finished: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn next_job(&self) -> Option<Io> {
        let mut jobs = lock(&self.jobs);
        loop {
            if let Some(io) = jobs.queue.pop_front() {
                return Some(io);
            }
            if jobs.closed {
                return None;
            }
            jobs.idle += 1;
            jobs = self.work.wait(jobs).unwrap_or_else(|e| e.into_inner());
            jobs.idle -= 1;
        }
    }

    fn complete(&self, c: Completion) {
        let mut done = lock(&self.done);
        done.list.push(c);
        if done.waiting {
            self.finished.notify_one();
        }
    }
}

pub struct PsyncEngine {
    fd: RawFd,
    is_block: bool,
    inline: bool,
    shared: Arc<Shared>,
    staged: Vec<Io>,
    /// Swapped with `Done::list` to take completions out without holding its lock.
    reaped: Vec<Completion>,
    threads: Vec<JoinHandle<()>>,
}

impl PsyncEngine {
    /// The two uses above: for a `sync_driver`, one I/O thread per CPU but one, and the
    /// engine thread; otherwise a thread per I/O of `depth`.
    pub fn new(fd: RawFd, depth: usize, is_block: bool, sync_driver: bool) -> io::Result<Self> {
        if sync_driver {
            let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
            Self::with_threads(fd, (cpus - 1).max(1), true, is_block)
        } else {
            Self::with_threads(fd, depth, false, is_block)
        }
    }

    /// `threads` I/O threads; with `inline`, the engine thread also runs queued I/Os while it
    /// waits for a completion.
    fn with_threads(fd: RawFd, threads: usize, inline: bool, is_block: bool) -> io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let mut engine = Self {
            fd,
            is_block,
            inline,
            shared: Arc::clone(&shared),
            staged: Vec::new(),
            reaped: Vec::new(),
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let shared = Arc::clone(&shared);
            let t = spawn_without_signals(std::thread::Builder::new().name(format!("psync-{i}")), move || {
                while let Some(io) = shared.next_job() {
                    shared.complete(perform(fd, &io, is_block, now_ns()));
                }
            })?;
            engine.threads.push(t); // on an error here, dropping `engine` ends the others
        }
        Ok(engine)
    }

    /// Hands the staged I/Os to the threads, waking an idle one per queued I/O; with
    /// `run_one`, first takes the oldest back for the engine thread to run.
    fn submit(&mut self, run_one: bool) -> Option<Io> {
        if self.staged.is_empty() && !run_one {
            return None; // a queued I/O has its thread already: one was woken when it came
        }
        let mut jobs = lock(&self.shared.jobs);
        jobs.queue.extend(self.staged.drain(..));
        let mine = if run_one { jobs.queue.pop_front() } else { None };
        let wake = jobs.idle.min(jobs.queue.len());
        drop(jobs);
        for _ in 0..wake {
            self.shared.work.notify_one();
        }
        mine
    }

    /// Waits for completions as `wait` asks, and moves them to `reaped`.
    fn take(&mut self, wait: Wait) {
        // Not waiting, the engine thread spins towards a deadline: it must not block on the
        // lock while a thread holding it is off the CPU; the completions keep till next time.
        let mut done = match (wait, self.shared.done.try_lock()) {
            (_, Ok(done)) => done,
            (Wait::No, Err(TryLockError::WouldBlock)) => return,
            _ => lock(&self.shared.done),
        };
        while done.list.is_empty() {
            let left = match wait {
                Wait::No => break,
                Wait::One => None,
                Wait::Until(t) => match t - now_ns() {
                    left if left > 0 => Some(Duration::from_nanos(left as u64)),
                    _ => break,
                },
            };
            done.waiting = true;
            done = match left {
                None => self.shared.finished.wait(done).unwrap_or_else(|e| e.into_inner()),
                Some(d) => self.shared.finished.wait_timeout(done, d).unwrap_or_else(|e| e.into_inner()).0,
            };
            done.waiting = false;
        }
        mem::swap(&mut done.list, &mut self.reaped);
    }
}

/// Runs one I/O, its system call started right after `issue_ns` (the caller's last clock
/// read), and times its end.
#[inline]
pub(crate) fn perform(fd: RawFd, io: &Io, is_block: bool, issue_ns: i64) -> Completion {
    let off = io.offset as libc::off_t; // < 2^63: the boundary refuses larger offsets
    // SAFETY: a data I/O's buffer is valid for its length until this completion is reported
    // (the contract of `Engine::queue`); `fd` is the run's open target, closed only after
    // these threads are joined.
    let ret = unsafe {
        match io.kind {
            // The system call itself, not libc's pread or pwrite: those wrappers are
            // cancellation points, and switching asynchronous cancellation on and off around
            // every call took 1.3 % of the pool threads' CPU on zram reads, 0.8 % at 70/30
            // (perf); nothing here is ever cancelled.
            IoKind::Read { buf, len } => libc::syscall(libc::SYS_pread64, fd, buf, len as usize, off),
            IoKind::Write { buf, len, fua: false } => libc::syscall(libc::SYS_pwrite64, fd, buf, len as usize, off),
            IoKind::Write { buf, len, fua: true } => {
                let iov = libc::iovec { iov_base: buf.cast_mut().cast(), iov_len: len as usize };
                libc::pwritev2(fd, &iov, 1, off, libc::RWF_DSYNC) as i64
            }
            IoKind::Flush => libc::fdatasync(fd) as i64,
            IoKind::Discard { len } if is_block => {
                let range: [u64; 2] = [io.offset, len];
                libc::ioctl(fd, BLKDISCARD, range.as_ptr()) as i64
            }
            IoKind::Discard { len } => libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len as libc::off_t, // < 2^63, as the offset
            ) as i64,
        }
    };
    let result = if ret < 0 { -(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as i64) } else { ret };
    Completion { token: io.token, result, issue_ns: Some(issue_ns), complete_ns: now_ns() }
}

impl Engine for PsyncEngine {
    unsafe fn queue(&mut self, io: Io) {
        self.staged.push(io);
    }

    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
        // Rather than sleep until a thread finishes an I/O, the engine thread runs one itself
        // (never while it spins towards a deadline: that is Wait::No).
        let mut reaped = 0;
        if let Some(io) = self.submit(self.inline && wait != Wait::No) {
            done(perform(self.fd, &io, self.is_block, now_ns()));
            reaped += 1;
            self.take(Wait::No);
        } else {
            self.take(wait);
        }
        reaped += self.reaped.len();
        self.reaped.drain(..).for_each(&mut *done);
        // Each completion carries its own issue time: nothing is submitted here.
        Ok(Entered { reaped, submitted_ns: None, seen_ns: None })
    }
}

impl Drop for PsyncEngine {
    fn drop(&mut self) {
        lock(&self.shared.jobs).closed = true; // threads finish the queue, then end
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// Reads every 4 KiB block of a file in a shuffled order, QD 16, and checks that each
    /// I/O completes once, with its block's bytes, however the threads share the work, and
    /// that each enter reaps at least `each_enter`.
    fn reads_come_back_once_with_their_data(threads: usize, inline: bool, wait: Wait, each_enter: usize) {
        const BLOCKS: usize = 500;
        let mut file = tempfile();
        let data: Vec<u8> = (0..BLOCKS * 4096).map(|i| (i / 4096 * 7 + i % 251) as u8).collect();
        file.write_all(&data).unwrap();
        let mut bufs = vec![0u8; BLOCKS * 4096];
        let mut engine = PsyncEngine::with_threads(file.as_raw_fd(), threads, inline, false).unwrap();
        let order: Vec<usize> = (0..BLOCKS).map(|i| i * 193 % BLOCKS).collect();
        let (depth, mut next, mut inflight) = (16, 0, 0);
        let mut seen: HashMap<u64, i64> = HashMap::new();
        while seen.len() < BLOCKS {
            while inflight < depth && next < BLOCKS {
                let block = order[next];
                let buf = bufs[block * 4096..].as_mut_ptr();
                let io = Io { token: block as u64, offset: (block * 4096) as u64, kind: IoKind::Read { buf, len: 4096 } };
                // SAFETY: `buf` is 4096 bytes of `bufs`, untouched until the engine is dropped.
                unsafe { engine.queue(io) };
                next += 1;
                inflight += 1;
            }
            let wait = match wait {
                Wait::Until(_) => Wait::Until(now_ns() + 1_000_000),
                w => w,
            };
            let n = engine
                .enter(wait, &mut |c| {
                    let issue = c.issue_ns.expect("psync times each I/O's start");
                    assert!(issue > 0 && c.complete_ns >= issue);
                    assert!(seen.insert(c.token, c.result).is_none(), "I/O {} completed twice", c.token);
                })
                .unwrap()
                .reaped;
            assert!(n >= each_enter, "an enter reaped {n}");
            inflight -= n;
        }
        assert!(seen.values().all(|&r| r == 4096));
        drop(engine);
        assert!(bufs == data);
    }

    fn tempfile() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("psync-test-{}-{:?}", std::process::id(), std::thread::current().id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    #[test]
    fn a_thread_per_io_in_flight() {
        reads_come_back_once_with_their_data(16, false, Wait::One, 1);
        reads_come_back_once_with_their_data(16, false, Wait::No, 0);
    }

    #[test]
    fn without_threads_the_engine_thread_runs_each_io_when_it_would_wait() {
        reads_come_back_once_with_their_data(0, true, Wait::Until(0), 1);
    }

    #[test]
    fn the_engine_thread_runs_ios_while_it_waits() {
        for threads in [1, 3] {
            reads_come_back_once_with_their_data(threads, true, Wait::One, 1);
            reads_come_back_once_with_their_data(threads, true, Wait::Until(0), 0);
            reads_come_back_once_with_their_data(threads, true, Wait::No, 0);
        }
    }
}

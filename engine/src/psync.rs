//! The psync engine: a pool of threads doing pread/pwrite, for where io_uring is refused
//! (Docker's default seccomp profile answers EPERM). Each thread times its own syscall's end.

use std::io;
use std::os::fd::RawFd;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backend::{Engine, Io, Wait, OP_DISCARD, OP_FLUSH, OP_READ};
use crate::clock::now_ns;

/// BLKDISCARD = _IO(0x12, 119): discard a byte range [start, start + len) of a block device.
const BLKDISCARD: libc::c_ulong = (0x12 << 8) | 119;

pub struct PsyncEngine {
    jobs: Option<SyncSender<Io>>,
    done: Receiver<(u64, i64, i64)>,
    staged: Vec<Io>,
    threads: Vec<JoinHandle<()>>,
}

impl PsyncEngine {
    /// `depth` threads, so every I/O in flight has a thread of its own.
    pub fn new(fd: RawFd, depth: usize, is_block: bool) -> io::Result<Self> {
        let (jobs_tx, jobs_rx) = sync_channel::<Io>(depth);
        let (done_tx, done_rx) = sync_channel(depth);
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let threads = (0..depth)
            .map(|i| {
                let jobs = Arc::clone(&jobs_rx);
                let done = done_tx.clone();
                std::thread::Builder::new().name(format!("psync-{i}")).spawn(move || {
                    crate::clock::block_termination_signals();
                    loop {
                        let job = jobs.lock().map(|rx| rx.recv());
                        let Ok(Ok(io)) = job else { break };
                        let result = perform(fd, &io, is_block);
                        if done.send((io.token, result, now_ns())).is_err() {
                            break;
                        }
                    }
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { jobs: Some(jobs_tx), done: done_rx, staged: Vec::with_capacity(depth), threads })
    }
}

fn perform(fd: RawFd, io: &Io, is_block: bool) -> i64 {
    let (off, len) = (io.offset as libc::off_t, io.len as usize);
    // SAFETY: `io.buf` points at `len` bytes of the run's buffers (see backend::Io); `fd` is
    // the run's open target, closed only after these threads are joined.
    let ret = unsafe {
        match io.op {
            OP_READ => libc::pread(fd, io.buf.cast(), len, off) as i64,
            OP_FLUSH => libc::fdatasync(fd) as i64,
            OP_DISCARD if is_block => {
                let range = [io.offset, io.len as u64];
                libc::ioctl(fd, BLKDISCARD, range.as_ptr()) as i64
            }
            OP_DISCARD => libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len as libc::off_t,
            ) as i64,
            _ => {
                let iov = libc::iovec { iov_base: io.buf.cast(), iov_len: len };
                let flags = if io.fua { libc::RWF_DSYNC } else { 0 };
                libc::pwritev2(fd, &iov, 1, off, flags) as i64
            }
        }
    };
    if ret < 0 {
        -(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as i64)
    } else {
        ret
    }
}

impl Engine for PsyncEngine {
    fn queue(&mut self, io: Io) {
        self.staged.push(io);
    }

    fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(u64, i64, i64)) -> io::Result<usize> {
        let jobs = self.jobs.as_ref().expect("psync engine used after shutdown");
        for io in self.staged.drain(..) {
            jobs.send(io).map_err(|_| io::Error::other("psync I/O threads have stopped"))?;
        }
        let mut n = 0;
        let first = match wait {
            Wait::No => self.done.try_recv().map_err(|e| e == TryRecvError::Disconnected),
            Wait::One => self.done.recv().map_err(|_| true),
            Wait::Until(t) => {
                let left = Duration::from_nanos((t - now_ns()).max(0) as u64);
                self.done.recv_timeout(left).map_err(|e| e == RecvTimeoutError::Disconnected)
            }
        };
        match first {
            Ok((token, result, at)) => {
                done(token, result, at);
                n += 1;
            }
            Err(true) => return Err(io::Error::other("psync I/O threads have stopped")),
            Err(false) => return Ok(0),
        }
        while let Ok((token, result, at)) = self.done.try_recv() {
            done(token, result, at);
            n += 1;
        }
        Ok(n)
    }
}

impl Drop for PsyncEngine {
    fn drop(&mut self) {
        self.jobs = None; // threads see the channel close and end
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

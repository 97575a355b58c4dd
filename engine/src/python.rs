//! The Python module `native._engine`: a `Replayer` that owns an engine thread. Python pushes
//! trace chunks in and takes result chunks out; the GIL is released whenever Rust waits, and
//! Ctrl-C is checked between waits.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::backend::Engine;
use crate::clock::{spawn_without_signals, Monotonic};
use crate::data::{Buffers, DataPattern, MAX_DATA_LENGTH};
use crate::null::NullEngine;
use crate::pool::{pool_size, run_pool, Psync};
use crate::psync::PsyncEngine;
use crate::run::{run, Chunk, ChunkResult, Mode, Summary, START_UNSET};
use crate::uring::UringEngine;

// The I/O engine itself could not start (the target opened fine): an OSError with errno.
// Defined in Python, in the one hierarchy of tracereplay's errors, so no caller translates it.
pyo3::import_exception!(traces.errors, EngineSetupError);

/// The one conversion from Rust I/O errors to Python: OSError with errno and a message
/// saying what the engine was doing.
fn os_error(context: &str, e: io::Error) -> PyErr {
    match e.raw_os_error() {
        Some(errno) => PyOSError::new_err((errno, format!("{context}: {e}"))),
        None => PyOSError::new_err(format!("{context}: {e}")),
    }
}

/// The same for a failure to set up the engine, so Python can fall back to another one.
fn setup_error(context: &str, e: io::Error) -> PyErr {
    let message = format!("{context}: {e}; try another --engine");
    EngineSetupError::new_err((e.raw_os_error().unwrap_or(libc::EIO), message))
}

type RunOutcome = io::Result<Summary>;

/// The engines a Replayer runs, by name: Python's list of choices (the CLI's --engine, the
/// runner's checks) is this one, exported as `native._engine.ENGINES`.
pub const ENGINES: [&str; 3] = ["io_uring", "psync", "null"];

/// The timing modes (`run::Mode`) by name, exported as `native._engine.TIMINGS`: the one list
/// the CLI's --timing and the runner's options derive from.
pub const TIMINGS: [&str; 3] = ["original", "afap", "causal"];

/// The most chunks a Replayer holds between Python's pushes and the engine (the runner uses 4).
const MAX_QUEUE_CHUNKS: usize = 4096;

/// The mode a timing name stands for: the one place a name becomes a `Mode`.
fn mode_of(timing: &str, speed: f64, think_scale: f64) -> PyResult<Mode> {
    match timing {
        "original" => Ok(Mode::Original { speed }),
        "afap" => Ok(Mode::Afap),
        "causal" if !(think_scale.is_finite() && think_scale >= 0.0) => {
            Err(PyValueError::new_err(format!("think_scale must be a number >= 0, not {think_scale}")))
        }
        "causal" => Ok(Mode::Causal { speed, think_scale }),
        other => Err(PyValueError::new_err(format!("unknown timing '{other}': use {}", TIMINGS.join(", ")))),
    }
}

/// One replay run on one target. Build it, `push` chunks, `take` results, then `close` and
/// `join`; `stop` asks it to finish early (in-flight I/Os are reaped, nothing more issued).
#[pyclass(module = "native._engine")]
pub struct Replayer {
    input: Option<SyncSender<Chunk>>,
    output: Mutex<Receiver<ChunkResult>>,
    stop: Arc<AtomicBool>,
    /// The run's start on the monotonic clock, or START_UNSET: read by the engine thread when
    /// the first chunk arrives.
    start: Arc<AtomicI64>,
    /// Rows completed so far (the engine thread stores it after every enter).
    completed: Arc<AtomicU64>,
    thread: Option<JoinHandle<RunOutcome>>,
    next_base: u64,
    /// A chunk has gone to the engine thread (which then fixes the start).
    pushed: bool,
    max_length: usize,
    /// Causal timing's think scale: then every chunk carries parents and think times.
    causal: Option<f64>,
}

/// A block device opened for writing is opened O_EXCL: the kernel then refuses (EBUSY) one
/// that is mounted or claimed, and keeps anyone from mounting it while the replay writes.
/// A read-only replay takes no claim, so it runs on a mounted disk (the system disk
/// included) and never opens it for writing.
fn open_target(path: &str, writable: bool, direct: bool, is_block: bool) -> io::Result<File> {
    let direct = if direct { libc::O_DIRECT } else { 0 };
    let exclusive = if is_block && writable { libc::O_EXCL } else { 0 };
    OpenOptions::new().read(true).write(writable).custom_flags(direct | exclusive).open(path)
}

/// How far a run has got, shared with its engine thread.
#[pyclass(module = "native._engine", frozen)]
pub struct Progress {
    completed: Arc<AtomicU64>,
}

#[pymethods]
impl Progress {
    /// Rows completed so far, across every chunk pushed: progress between the chunks that
    /// `take` returns.
    fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
}

#[pymethods]
impl Replayer {
    /// engine: one of ENGINES; timing: one of TIMINGS; depth: the most I/Os in flight (--qd
    /// in afap, --max-inflight otherwise); sync_driver: a block device whose driver runs each
    /// I/O on the submitting CPU (zram, brd), see `PsyncEngine::new`; max_length: the longest
    /// read or write to be pushed, in bytes (the buffers' size; discards and flushes carry
    /// no data); start_ns: the run's start on the monotonic clock, for runs that must share
    /// one (see also `start_at`). With causal timing every `push` gives each row's parents
    /// and think time, and think times are multiplied by think_scale; service_ns: the null
    /// engine completes each I/O this long after submitting it (0: at once).
    #[new]
    #[pyo3(signature = (target=None, *, engine="io_uring", timing="original", speed=1.0, depth=256,
                        writable=false, direct=true, is_block=false, sync_driver=false, max_length=1<<20,
                        data="random", queue_chunks=4, start_ns=None, think_scale=1.0,
                        service_ns=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        target: Option<&str>,
        engine: &str,
        timing: &str,
        speed: f64,
        depth: usize,
        writable: bool,
        direct: bool,
        is_block: bool,
        sync_driver: bool,
        max_length: usize,
        data: &str,
        queue_chunks: usize,
        start_ns: Option<i64>,
        think_scale: f64,
        service_ns: i64,
    ) -> PyResult<Self> {
        if service_ns < 0 || (service_ns > 0 && engine != "null") {
            return Err(PyValueError::new_err("service_ns is the null engine's, and >= 0"));
        }
        if !(speed.is_finite() && speed > 0.0) {
            return Err(PyValueError::new_err(format!("speed must be a positive number, not {speed}")));
        }
        if depth == 0 || depth > 32768 {
            return Err(PyValueError::new_err(format!("depth must be between 1 and 32768, not {depth}")));
        }
        if max_length > MAX_DATA_LENGTH {
            return Err(PyValueError::new_err(format!(
                "max_length must be at most {MAX_DATA_LENGTH} bytes (the most one read or write transfers), not {max_length}"
            )));
        }
        // sync_channel allocates its capacity up front: 2**62 chunks aborted the process.
        if queue_chunks > MAX_QUEUE_CHUNKS {
            return Err(PyValueError::new_err(format!(
                "queue_chunks must be at most {MAX_QUEUE_CHUNKS} (chunks waiting for the engine), not {queue_chunks}"
            )));
        }
        let pattern = DataPattern::parse(data).map_err(PyValueError::new_err)?;
        let mode = mode_of(timing, speed, think_scale)?;
        let causal = match mode {
            Mode::Causal { think_scale, .. } => Some(think_scale),
            _ => None,
        };
        let bufs = Buffers::new(max_length, depth, pattern);
        let file = match (engine, target) {
            ("null", _) => None,
            (_, Some(path)) => {
                Some(open_target(path, writable, direct, is_block).map_err(|e| os_error(&format!("cannot open {path}"), e))?)
            }
            (_, None) => return Err(PyValueError::new_err(format!("the {engine} engine needs a target"))),
        };
        let fd = file.as_ref().map_or(-1, |f| f.as_raw_fd());
        // psync replays in open loop and AFAP on a pool whose threads issue their own I/Os,
        // through descriptors of their own (see `Psync`): the first holds the O_EXCL claim,
        // the others open the target without it. One that cannot be opened (too many open
        // files) leaves its threads sharing the ones there are.
        let mut thread_files = Vec::new();
        let pool = (engine == "psync" && causal.is_none()).then(|| {
            let size = pool_size(depth, sync_driver);
            if let Some(path) = target {
                thread_files.extend((1..size.files(depth)).map_while(|_| open_target(path, writable, direct, false).ok()));
            }
            let fds = std::iter::once(fd).chain(thread_files.iter().map(|f| f.as_raw_fd())).collect();
            (Psync { fds, is_block }, size)
        });
        let eng: Option<Box<dyn Engine>> = match engine {
            "null" => Some(Box::new(NullEngine::with_service(depth, service_ns))),
            "psync" if pool.is_some() => None,
            "psync" => {
                let eng = PsyncEngine::new(fd, depth, is_block, sync_driver);
                Some(Box::new(eng.map_err(|e| setup_error("cannot start the psync threads", e))?))
            }
            "io_uring" => Some(Box::new(UringEngine::new(fd, depth, &bufs, is_block).map_err(|e| setup_error("cannot set up io_uring", e))?)),
            other => return Err(PyValueError::new_err(format!("unknown engine '{other}': use {}", ENGINES.join(", ")))),
        };
        let (in_tx, in_rx) = sync_channel(queue_chunks.max(1));
        let (out_tx, out_rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let start = Arc::new(AtomicI64::new(start_ns.unwrap_or(START_UNSET)));
        let start_flag = Arc::clone(&start);
        let completed = Arc::new(AtomicU64::new(0));
        let completed_count = Arc::clone(&completed);
        let thread = spawn_without_signals(std::thread::Builder::new().name("replay-engine".into()), move || {
                crate::clock::set_precise_timer_slack();
                let mut eng = eng;
                let summary = match (&mut eng, &pool) {
                    (Some(eng), _) => run(eng.as_mut(), &bufs, mode, depth, &start_flag, in_rx, out_tx, &stop_flag, &completed_count, &Monotonic),
                    (None, Some((psync, size))) => {
                        run_pool(psync, *size, &bufs, mode, depth, &start_flag, in_rx, out_tx, &stop_flag, &completed_count, &Monotonic)
                    }
                    (None, None) => unreachable!("an engine or a pool"),
                };
                // Order matters: the engine (its ring, its threads) goes before the buffers
                // it points into and the file it uses.
                drop(eng);
                drop(bufs);
                drop(thread_files);
                drop(file);
                summary
            })
            .map_err(|e| os_error("cannot start the engine thread", e))?;
        Ok(Self { input: Some(in_tx), output: Mutex::new(out_rx), stop, start, completed, thread: Some(thread), next_base: 0, pushed: false, max_length, causal })
    }

    /// The run's progress, readable from any thread: `push` and `join` hold the Replayer
    /// itself while they wait, so another thread could not call a method on it then.
    fn progress(&self) -> Progress {
        Progress { completed: Arc::clone(&self.completed) }
    }

    /// Set the run's start, `start_ns` on the monotonic clock (time.monotonic_ns()): the
    /// instant rows' deadlines count from and the engine waits for before issuing. Call it
    /// before the first `push`; it replaces the constructor's `start_ns`. Several workers
    /// built one after another call it with one common instant, so they start together.
    fn start_at(&self, start_ns: i64) -> PyResult<()> {
        if self.pushed {
            return Err(PyRuntimeError::new_err("start_at after the first push: the run has started"));
        }
        if start_ns == START_UNSET {
            return Err(PyValueError::new_err(format!("start_at: {start_ns} is not a time")));
        }
        self.start.store(start_ns, Ordering::Release);
        Ok(())
    }

    /// Hand the engine the next rows of the trace. Blocks (without the GIL) while the
    /// engine's queue is full. Every row is checked first: an unknown op, a negative offset
    /// or length, offset + length past 64 bits, or a read or write longer than `max_length`
    /// raises ValueError naming the row (its index among all rows pushed), and nothing of the
    /// chunk is queued. In causal mode `parent` and `parent2` (uint32: rows back to each
    /// row's parents, 0 for none) and `think_ns` are required, and checked as well: a think
    /// time that, times think_scale, is more than a year (`causal::MAX_THINK_NS`) is refused.
    #[pyo3(signature = (ts_ns, op, offset, length, flags=None, parent=None, parent2=None, think_ns=None))]
    fn push(
        &mut self,
        py: Python<'_>,
        ts_ns: PyReadonlyArray1<'_, i64>,
        op: PyReadonlyArray1<'_, u8>,
        offset: PyReadonlyArray1<'_, i64>,
        length: PyReadonlyArray1<'_, i64>,
        flags: Option<PyReadonlyArray1<'_, u8>>,
        parent: Option<PyReadonlyArray1<'_, u32>>,
        parent2: Option<PyReadonlyArray1<'_, u32>>,
        think_ns: Option<PyReadonlyArray1<'_, i64>>,
    ) -> PyResult<()> {
        let n = op.len();
        let lens = [ts_ns.len(), offset.len(), length.len(), flags.as_ref().map_or(n, |f| f.len())];
        if lens.iter().any(|&l| l != n) {
            return Err(PyValueError::new_err("push: all columns must have the same length"));
        }
        let chunk = Chunk::new(
            self.next_base,
            ts_ns.as_slice()?.to_vec(),
            op.as_slice()?.to_vec(),
            offset.as_slice()?.to_vec(),
            length.as_slice()?.to_vec(),
            flags.map(|f| f.as_slice().map(<[u8]>::to_vec)).transpose()?,
            self.max_length,
        )
        .map_err(|e| PyValueError::new_err(format!("push: {e}")))?;
        let chunk = match (self.causal, parent, parent2, think_ns) {
            (Some(scale), Some(p), Some(q), Some(t)) => chunk
                .with_deps(p.as_slice()?.to_vec(), q.as_slice()?.to_vec(), t.as_slice()?.to_vec(), scale)
                .map_err(|e| PyValueError::new_err(format!("push: {e}")))?,
            (Some(_), ..) => return Err(PyValueError::new_err("push: causal timing needs parent, parent2 and think_ns")),
            (None, None, None, None) => chunk,
            (None, ..) => return Err(PyValueError::new_err("push: parent, parent2 and think_ns are for causal timing")),
        };
        let mut chunk = Some(chunk);
        let input = self.input.as_ref().ok_or_else(|| PyRuntimeError::new_err("push after close"))?;
        loop {
            match input.try_send(chunk.take().expect("chunk")) {
                Ok(()) => break,
                Err(TrySendError::Full(c)) => {
                    chunk = Some(c);
                    py.detach(|| std::thread::sleep(Duration::from_millis(2)));
                    py.check_signals()?;
                }
                // The engine thread ended (stopped or failed); `join` says why.
                Err(TrySendError::Disconnected(_)) => return Ok(()),
            }
        }
        self.next_base += n as u64;
        self.pushed = true;
        Ok(())
    }

    /// The next finished chunk as (intended_ns, issue_ns, complete_ns, result, issued), in
    /// push order, or None: when nothing is ready (block=False) or the run is over.
    #[pyo3(signature = (block=true))]
    #[allow(clippy::type_complexity)]
    fn take<'py>(
        &self,
        py: Python<'py>,
        block: bool,
    ) -> PyResult<
        Option<(Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, usize)>,
    > {
        let wait = Duration::from_millis(if block { 50 } else { 0 });
        let got = loop {
            match py.detach(|| self.output.lock().expect("engine output lock").recv_timeout(wait)) {
                Ok(r) => break Some(r),
                Err(RecvTimeoutError::Timeout) if block => py.check_signals()?,
                Err(_) => break None,
            }
        };
        Ok(got.map(|r| {
            (
                r.intended_ns.into_pyarray(py),
                r.issue_ns.into_pyarray(py),
                r.complete_ns.into_pyarray(py),
                r.result.into_pyarray(py),
                r.issued,
            )
        }))
    }

    /// No more chunks will come: the run ends when everything pushed has completed.
    fn close(&mut self) {
        self.input = None;
    }

    /// Ask the run to end now: nothing more is issued, in-flight I/Os are reaped.
    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Wait for the engine thread (without the GIL) and return its summary, or raise the
    /// error that ended it. Call after `close` or `stop`.
    fn join<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.input = None;
        let handle = self.thread.take().ok_or_else(|| PyRuntimeError::new_err("join called twice"))?;
        while !handle.is_finished() {
            py.detach(|| std::thread::sleep(Duration::from_millis(5)));
            if let Err(e) = py.check_signals() {
                self.stop.store(true, Ordering::Relaxed);
                let _ = py.detach(|| handle.join());
                return Err(e);
            }
        }
        let outcome = handle.join().map_err(|_| PyRuntimeError::new_err("the engine thread panicked"))?;
        let summary = outcome.map_err(|e| os_error("the I/O engine failed", e))?;
        let d = PyDict::new(py);
        d.set_item("start_monotonic_ns", summary.start_ns)?;
        d.set_item("rows_issued", summary.rows_issued)?;
        d.set_item("interrupted", summary.interrupted)?;
        d.set_item("cpu_ns", summary.cpu_ns)?;
        Ok(d)
    }
}

impl Drop for Replayer {
    fn drop(&mut self) {
        // A Replayer dropped mid-run (an exception in Python) must not leave I/O running.
        self.stop.store(true, Ordering::Relaxed);
        self.input = None;
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

#[pymodule]
fn _engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Replayer>()?;
    m.add_class::<Progress>()?;
    m.add("ENGINES", PyTuple::new(m.py(), ENGINES)?)?;
    m.add("TIMINGS", PyTuple::new(m.py(), TIMINGS)?)?;
    crate::python_text::register(m)
}

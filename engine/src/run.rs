//! The core of a replay: paces rows to their deadlines, hands them to an engine, and writes
//! every row's intended, issue and completion time and result into arrays preallocated per
//! chunk. The trace arrives as a stream of chunks, checked row by row as they come in;
//! finished chunks leave in order. Each turn of the loop is three steps, as in fio and
//! liburing: issue what is due, reap (submit and wait in one `enter`), retire finished chunks.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::Duration;

use crate::backend::{Engine, Io, IoKind, Wait, FLAG_FUA, OP_DISCARD, OP_FLUSH, OP_READ, OP_WRITE};
use crate::causal::{scaled_think, Deps, Scheduler, BARRIER, MAX_THINK_NS, WINDOW};
use crate::clock::{intended_ns, thread_cpu_ns, Clock, SPIN_NS};
use crate::data::Buffers;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Open loop: row i is due at start + ts_ns[i] / speed.
    Original { speed: f64 },
    /// Closed loop: as fast as possible, with up to `depth` in flight.
    Afap,
    /// Causal: row i is due when its parents (rows back, see `Chunk::with_deps`) have
    /// completed, plus its think time times `think_scale`; a row without parents at
    /// start + ts_ns[i] / speed. Rows go in due order, not row order (causal.rs).
    Causal { speed: f64, think_scale: f64 },
}

/// Never block longer than this, so a stop request is seen promptly even in a long idle gap.
pub(crate) const MAX_BLOCK_NS: i64 = 50_000_000;

/// `run`'s start when none was set: the first chunk's arrival.
pub const START_UNSET: i64 = i64::MIN;

/// A row the engine cannot run, found before any row of its chunk is queued.
#[derive(Debug, Clone, PartialEq)]
pub struct BadRow {
    /// The row's index in the whole stream (all chunks pushed), not in its chunk.
    pub row: u64,
    pub problem: String,
}

impl fmt::Display for BadRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "row {}: {}", self.row, self.problem)
    }
}

/// What is wrong with one row, if anything, for buffers of `max_length` bytes.
fn check_row(op: u8, offset: i64, length: i64, max_length: u64) -> Result<(), String> {
    let name = match op {
        OP_READ => "read",
        OP_WRITE => "write",
        OP_DISCARD | OP_FLUSH => "",
        _ => return Err(format!("unknown op {op} (valid: 0 read, 1 write, 2 discard, 3 flush)")),
    };
    if offset < 0 {
        return Err(format!("negative offset {offset}"));
    }
    if length < 0 {
        return Err(format!("negative length {length}"));
    }
    if offset.checked_add(length).is_none() {
        return Err(format!("offset {offset} + length {length} overflows 64 bits"));
    }
    if !name.is_empty() && length as u64 > max_length {
        return Err(format!(
            "a {length}-byte {name} is longer than the {max_length}-byte buffers the engine was built with (max_length)"
        ));
    }
    Ok(())
}

/// A slice of the trace: the columns the engine needs, rows `base..base + len`. Built only
/// by `Chunk::new`, which checks every row, so the loop can trust them.
pub struct Chunk {
    pub(crate) base: u64,
    pub(crate) ts_ns: Vec<i64>,
    pub(crate) op: Vec<u8>,
    offset: Vec<i64>,
    pub(crate) length: Vec<i64>,
    flags: Option<Vec<u8>>,
    deps: Option<ChunkDeps>,
}

/// The columns of causal timing: each row's parents as rows back (0: none) and think time.
struct ChunkDeps {
    parent: Vec<u32>,
    parent2: Vec<u32>,
    think_ns: Vec<i64>,
}

impl Chunk {
    /// Checks that the columns have one length and that every row is one the engine can run
    /// with buffers of `max_length` bytes: a known op, offset and length >= 0, offset + length
    /// within 64 bits, and a read or write no longer than the buffers.
    pub fn new(
        base: u64,
        ts_ns: Vec<i64>,
        op: Vec<u8>,
        offset: Vec<i64>,
        length: Vec<i64>,
        flags: Option<Vec<u8>>,
        max_length: usize,
    ) -> Result<Self, BadRow> {
        let n = op.len();
        if ts_ns.len() != n || offset.len() != n || length.len() != n || flags.as_ref().is_some_and(|f| f.len() != n) {
            return Err(BadRow { row: base, problem: "the columns of a chunk must all have the same length".into() });
        }
        for i in 0..n {
            check_row(op[i], offset[i], length[i], max_length as u64)
                .map_err(|problem| BadRow { row: base + i as u64, problem })?;
        }
        Ok(Self { base, ts_ns, op, offset, length, flags, deps: None })
    }

    /// The chunk with causal timing's columns, checked: one length with the chunk, parents at
    /// most `WINDOW - 1` rows back (the rows the scheduler holds) or, for parent2, BARRIER (all
    /// earlier rows), think times >= 0 and, times `think_scale`, at most `MAX_THINK_NS`.
    pub fn with_deps(mut self, parent: Vec<u32>, parent2: Vec<u32>, think_ns: Vec<i64>, think_scale: f64) -> Result<Self, BadRow> {
        let n = self.len();
        if parent.len() != n || parent2.len() != n || think_ns.len() != n {
            return Err(BadRow { row: self.base, problem: "the causal columns must have the chunk's length".into() });
        }
        for i in 0..n {
            // parent2 may be BARRIER: wait for every earlier row.
            let far = parent[i].max(if parent2[i] == BARRIER { 0 } else { parent2[i] });
            if far as usize >= WINDOW {
                let problem = format!("a parent {far} rows back; causal timing holds at most {} rows", WINDOW - 1);
                return Err(BadRow { row: self.base + i as u64, problem });
            }
            if think_ns[i] < 0 {
                return Err(BadRow { row: self.base + i as u64, problem: format!("negative think time {}", think_ns[i]) });
            }
            if scaled_think(think_ns[i], think_scale) > MAX_THINK_NS {
                let problem = format!(
                    "a think time of {} ns (x{think_scale} think scale) is more than a year, longer than any replay can wait",
                    think_ns[i]
                );
                return Err(BadRow { row: self.base + i as u64, problem });
            }
        }
        self.deps = Some(ChunkDeps { parent, parent2, think_ns });
        Ok(self)
    }

    /// Row `i`'s causal inputs (none without the columns).
    fn deps(&self, i: usize) -> Deps {
        match &self.deps {
            Some(d) => Deps { parents: [d.parent[i], d.parent2[i]], think_ns: d.think_ns[i] },
            None => Deps { parents: [0, 0], think_ns: 0 },
        }
    }

    pub fn len(&self) -> usize {
        self.op.len()
    }

    /// What row `i` records for an engine's `result`: a discard or punch-hole reports 0 on
    /// success, and records the bytes it covered.
    #[inline]
    pub(crate) fn result(&self, i: usize, result: i64) -> i64 {
        if self.op[i] == OP_DISCARD && result == 0 {
            self.length[i]
        } else {
            result
        }
    }

    pub fn is_empty(&self) -> bool {
        self.op.is_empty()
    }

    /// Row `i` as an I/O, its data buffer taken from `bufs` (which checks its length).
    #[inline]
    fn io(&self, i: usize, bufs: &Buffers) -> Io {
        self.io_reading_into(i, bufs, self.base + i as u64)
    }

    /// Row `i` as an I/O; a read lands in the read slot `bufs` picks for `slot` (the psync
    /// pool gives each thread its own, so no two reads share pages).
    #[inline]
    pub(crate) fn io_reading_into(&self, i: usize, bufs: &Buffers, slot: u64) -> Io {
        let token = self.base + i as u64;
        let len = self.length[i]; // >= 0, and <= the buffers for data: checked in `new`
        let kind = match self.op[i] {
            OP_READ => IoKind::Read { buf: bufs.read_destination(slot, len as usize), len: len as u32 },
            OP_WRITE => {
                let fua = self.flags.as_ref().is_some_and(|f| f[i] & FLAG_FUA != 0);
                IoKind::Write { buf: bufs.write_source(token, len as usize), len: len as u32, fua }
            }
            OP_DISCARD => IoKind::Discard { len: len as u64 },
            OP_FLUSH => IoKind::Flush,
            op => unreachable!("row {token}: op {op} passed Chunk::new"),
        };
        Io { token, offset: self.offset[i] as u64, kind }
    }
}

/// What the engine measured for one chunk. Rows at and after `issued` were never issued
/// (the run was stopped) and hold -1; in causal mode rows go out of order, `issued` counts
/// them, and a row never issued is one whose issue_ns is -1.
pub struct ChunkResult {
    pub base: u64,
    pub intended_ns: Vec<i64>,
    pub issue_ns: Vec<i64>,
    pub complete_ns: Vec<i64>,
    pub result: Vec<i64>,
    pub issued: usize,
}

struct Active {
    chunk: Chunk,
    out: ChunkResult,
    outstanding: usize,
}

impl Active {
    fn new(chunk: Chunk) -> Self {
        let n = chunk.len();
        let out = ChunkResult {
            base: chunk.base,
            intended_ns: vec![-1; n],
            issue_ns: vec![-1; n],
            complete_ns: vec![-1; n],
            result: vec![0; n],
            issued: 0,
        };
        Self { chunk, out, outstanding: 0 }
    }

    fn exhausted(&self) -> bool {
        self.out.issued == self.chunk.len()
    }
}

pub struct Summary {
    pub start_ns: i64,
    pub rows_issued: u64,
    pub interrupted: bool,
    /// CPU time of the thread that ran the replay (not the kernel's I/O workers).
    pub cpu_ns: i64,
}

/// The state of one run between the steps of its loop.
struct Core<'a, C: Clock> {
    engine: &'a mut dyn Engine,
    bufs: &'a Buffers,
    clock: &'a C,
    mode: Mode,
    depth: usize,
    /// Closed loop: rows queued per issue step at most, each step followed by an enter
    /// (`Engine::submit_batch`).
    batch: usize,
    t0: i64,
    active: VecDeque<Active>,
    inflight: usize,
    rows_issued: u64,
    /// Causal mode: the rows admitted and their readiness; the rows queued since the last
    /// `enter`, whose issue time its submission sets.
    sched: Option<Box<Scheduler>>,
    queued_rows: Vec<u64>,
    /// Closed loop: when the last `enter` saw the completions it reaped (`Entered::seen_ns`),
    /// which freed the slots of the next rows, so they are due then and the issue step need
    /// not read the clock again (one read a row instead of two on the null engine at QD1: 21
    /// of its 62 ns a row; three instead of two per I/O for io_uring at QD1). Cleared when a
    /// chunk comes or goes, work that takes time.
    freed_ns: Option<i64>,
}

impl<C: Clock> Core<'_, C> {
    /// Whether a row is left to issue: in the newest chunk, or in causal mode, a ready row or
    /// one not yet admitted.
    fn has_next(&self) -> bool {
        match &self.sched {
            Some(s) => s.peek().is_some() || self.unadmitted(s),
            None => self.active.back().is_some_and(|a| !a.exhausted()),
        }
    }

    fn unadmitted(&self, s: &Scheduler) -> bool {
        self.active.back().is_some_and(|a| s.admitted() < a.chunk.base + a.chunk.len() as u64)
    }

    /// Whether to take the next chunk from the input: in causal mode as soon as every row
    /// held is admitted and the window has room, so a later row due sooner is seen in time.
    fn wants_input(&self) -> bool {
        match &self.sched {
            Some(s) => !self.unadmitted(s) && s.has_room(),
            None => !self.has_next(),
        }
    }

    /// Take the next chunk of the input.
    fn push(&mut self, chunk: Chunk) {
        self.active.push_back(Active::new(chunk));
        self.freed_ns = None;
    }

    /// Causal mode: admit the rows that arrived, in order, while the window has room.
    fn admit(&mut self) {
        let Some(s) = self.sched.as_mut() else { return };
        for a in self.active.iter() {
            let end = a.chunk.base + a.chunk.len() as u64;
            while s.admitted() < end && s.admitted() >= a.chunk.base && s.has_room() {
                let i = (s.admitted() - a.chunk.base) as usize;
                s.admit(a.chunk.ts_ns[i], a.chunk.deps(i));
            }
        }
    }

    /// Causal issue step: queue the ready rows that are due, earliest first, or say how to
    /// wait for the first one; with none ready, wait for a completion to make one ready.
    fn issue_causal(&mut self) -> Wait {
        let now = self.clock.now() - self.t0;
        let s = self.sched.as_mut().expect("causal");
        let Some((next_due, _)) = s.peek() else {
            return if self.inflight > 0 { Wait::One } else { Wait::No };
        };
        if next_due > now + SPIN_NS {
            return Wait::Until(self.t0 + (next_due - SPIN_NS).min(now + MAX_BLOCK_NS));
        } else if next_due > now {
            return Wait::No;
        }
        while self.inflight < self.depth {
            match s.peek() {
                Some((due, _)) if due <= now => {}
                _ => break,
            }
            let (due, row) = s.pop().expect("peeked");
            let a = self
                .active
                .iter_mut()
                .find(|a| row >= a.chunk.base && row < a.chunk.base + a.chunk.len() as u64)
                .expect("a ready row of a chunk still held");
            let i = (row - a.chunk.base) as usize;
            let io = a.chunk.io(i, self.bufs);
            // SAFETY: as in `issue`.
            unsafe { self.engine.queue(io) };
            a.out.intended_ns[i] = due;
            a.out.issue_ns[i] = now;
            a.out.issued += 1;
            a.outstanding += 1;
            self.inflight += 1;
            self.rows_issued += 1;
            self.queued_rows.push(row);
        }
        Wait::No
    }

    /// Issue step: queue every row that is due (up to `depth` in flight), or say how to wait
    /// for the next deadline. Deadlines are absolute (start + ts / speed), never relative to
    /// when the previous row went: one late row does not delay the rest. Returns how to wait
    /// and the rows queued, in the newest chunk.
    fn issue(&mut self) -> (Wait, Range<usize>) {
        if self.sched.is_some() {
            return (self.issue_causal(), 0..0);
        }
        let now = match self.freed_ns.take() {
            Some(t) => t,
            None => self.clock.now(),
        } - self.t0;
        let (mode, t0) = (self.mode, self.t0);
        let a = self.active.back_mut().expect("issue without a row");
        let due = |i: usize| match mode {
            Mode::Original { speed } | Mode::Causal { speed, .. } => intended_ns(a.chunk.ts_ns[i], speed),
            Mode::Afap => now,
        };
        let (first, next_due) = (a.out.issued, due(a.out.issued));
        if next_due > now + SPIN_NS {
            return (Wait::Until(t0 + (next_due - SPIN_NS).min(now + MAX_BLOCK_NS)), first..first);
        } else if next_due > now {
            return (Wait::No, first..first); // spin: reap completions while the deadline comes
        }
        let mut i = first;
        let end = if mode == Mode::Afap { (first + self.batch).min(a.chunk.len()) } else { a.chunk.len() };
        while i < end && self.inflight < self.depth && due(i) <= now {
            let io = a.chunk.io(i, self.bufs);
            // SAFETY: the buffer comes from `self.bufs`, which checked its length; the run's
            // caller drops the engine (which reaps or abandons every I/O) before the buffers.
            unsafe { self.engine.queue(io) };
            a.out.intended_ns[i] = due(i);
            // Until the engine says when it submitted the row: the hand-off.
            a.out.issue_ns[i] = now;
            i += 1;
            self.inflight += 1;
        }
        a.out.issued = i;
        a.outstanding += i - first;
        self.rows_issued += (i - first) as u64;
        let wait = if mode == Mode::Afap && self.inflight >= self.depth { Wait::One } else { Wait::No };
        (wait, first..i)
    }

    /// Reap step: one `enter` submits what `issue` queued (`queued`, rows of the newest chunk)
    /// and waits as asked; records when each I/O entered the kernel, when it completed and
    /// its result.
    fn reap(&mut self, wait: Wait, queued: Range<usize>) -> io::Result<()> {
        let (t0, active, sched) = (self.t0, &mut self.active, &mut self.sched);
        let entered = self.engine.enter(wait, &mut |c| {
            let a = active
                .iter_mut()
                .find(|a| c.token >= a.chunk.base && c.token < a.chunk.base + a.chunk.len() as u64)
                .expect("completion for a row the engine never issued");
            let i = (c.token - a.chunk.base) as usize;
            if let Some(at) = c.issue_ns {
                a.out.issue_ns[i] = at - t0;
            }
            a.out.complete_ns[i] = c.complete_ns - t0;
            a.out.result[i] = a.chunk.result(i, c.result);
            a.outstanding -= 1;
            // Its children wait for its completion, failed or not.
            if let Some(s) = sched.as_mut() {
                s.complete(c.token, c.complete_ns - t0);
            }
        })?;
        self.inflight -= entered.reaped;
        if let Some(at) = entered.submitted_ns {
            if self.sched.is_some() {
                for &row in &self.queued_rows {
                    let a = self.active.iter_mut().find(|a| row >= a.chunk.base && row < a.chunk.base + a.chunk.len() as u64);
                    // A row that completed in this same enter may have retired with its chunk: no.
                    if let Some(a) = a {
                        a.out.issue_ns[(row - a.chunk.base) as usize] = at - t0;
                    }
                }
            } else if let Some(a) = self.active.back_mut() {
                a.out.issue_ns[queued].fill(at - t0);
            }
        }
        self.queued_rows.clear();
        if self.mode == Mode::Afap {
            self.freed_ns = entered.seen_ns;
        }
        Ok(())
    }

    /// Retire step: send finished chunks, oldest first. False when nobody listens any more.
    fn retire(&mut self, output: &Sender<ChunkResult>) -> bool {
        while self.active.front().is_some_and(|a| a.exhausted() && a.outstanding == 0) {
            let a = self.active.pop_front().expect("front");
            self.freed_ns = None;
            if output.send(a.out).is_err() {
                return false;
            }
        }
        true
    }
}

/// The start of a run: waits for the first chunk, then for the start instant (`start`'s value,
/// or the first chunk's arrival if it is START_UNSET), returning both. Stopped meanwhile, it
/// sends the chunk back unissued and returns the run's summary instead.
pub(crate) fn begin<C: Clock>(
    input: &Receiver<Chunk>,
    output: &Sender<ChunkResult>,
    start: &AtomicI64,
    stop: &AtomicBool,
    clock: &C,
) -> Result<(Chunk, i64), Summary> {
    let (first, t0) = first_chunk(input, start, stop, clock)?;
    if wait_or_stop(clock, t0, stop).is_none() {
        let _ = output.send(Active::new(first).out);
        return Err(stopped(t0));
    }
    Ok((first, t0))
}

/// `begin` without the wait: the first chunk and the start instant, or the run's summary if
/// stopped before the first chunk came or the input ended empty.
pub(crate) fn first_chunk<C: Clock>(input: &Receiver<Chunk>, start: &AtomicI64, stop: &AtomicBool, clock: &C) -> Result<(Chunk, i64), Summary> {
    let first = loop {
        if stop.load(Ordering::Relaxed) {
            return Err(stopped(clock.now()));
        }
        match input.recv_timeout(Duration::from_millis(50)) {
            Ok(chunk) => break chunk,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Summary { start_ns: clock.now(), rows_issued: 0, interrupted: false, cpu_ns: thread_cpu_ns() })
            }
        }
    };
    let t0 = match start.load(Ordering::Acquire) {
        START_UNSET => clock.now(),
        t => t,
    };
    Ok((first, t0))
}

/// The summary of a run stopped before its first I/O.
pub(crate) fn stopped(start_ns: i64) -> Summary {
    Summary { start_ns, rows_issued: 0, interrupted: true, cpu_ns: thread_cpu_ns() }
}

/// Wait until `t` on `clock`, in steps of at most MAX_BLOCK_NS so that a stop request is seen
/// (a start or a deadline may lie hours ahead); returns the time `wait_until` last read, or
/// None if stopped first.
#[inline]
pub(crate) fn wait_or_stop<C: Clock>(clock: &C, t: i64, stop: &AtomicBool) -> Option<i64> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let now = clock.now();
        if t - now <= MAX_BLOCK_NS {
            return Some(clock.wait_until(t));
        }
        clock.sleep_until(now + MAX_BLOCK_NS);
    }
}

/// Run until the input closes and everything issued has completed, or until `stop` is set
/// (then in-flight I/Os are reaped and the unissued rest is returned marked). Times in the
/// results are relative to the start: `start`'s value on `clock` if it is not START_UNSET
/// when the first chunk arrives (several runs in parallel share one start), else that arrival.
/// `completed` counts the rows completed so far, for progress.
#[allow(clippy::too_many_arguments)]
pub fn run<C: Clock>(
    engine: &mut dyn Engine,
    bufs: &Buffers,
    mode: Mode,
    depth: usize,
    start: &AtomicI64,
    input: Receiver<Chunk>,
    output: Sender<ChunkResult>,
    stop: &AtomicBool,
    completed: &AtomicU64,
    clock: &C,
) -> io::Result<Summary> {
    engine.start()?;
    let (first, t0) = match begin(&input, &output, start, stop, clock) {
        Ok(begun) => begun,
        Err(summary) => return Ok(summary),
    };
    let sched = match mode {
        Mode::Causal { speed, think_scale } => Some(Box::new(Scheduler::new(speed, think_scale))),
        _ => None,
    };
    let batch = engine.submit_batch(depth).max(1);
    let mut core = Core {
        engine,
        bufs,
        clock,
        mode,
        depth,
        batch,
        t0,
        active: VecDeque::from([Active::new(first)]),
        inflight: 0,
        rows_issued: 0,
        sched,
        queued_rows: Vec::with_capacity(depth),
        freed_ns: None,
    };
    let (mut input_open, mut stopping, mut failure) = (true, false, None);
    loop {
        stopping = stopping || stop.load(Ordering::Relaxed);
        // Make sure the newest chunk has a row to issue, pulling the next one if needed.
        let mut starved = false;
        if !stopping && core.wants_input() && input_open {
            match input.try_recv() {
                Ok(chunk) => core.push(chunk),
                Err(TryRecvError::Empty) => starved = true,
                Err(TryRecvError::Disconnected) => input_open = false,
            }
        }
        core.admit();
        let (wait, queued) = if !stopping && core.has_next() && core.inflight < depth {
            let (wait, queued) = core.issue();
            // Causal: rows of a chunk still to come may be due before the ready ones.
            match wait {
                Wait::Until(t) if starved && core.sched.is_some() => (Wait::Until(t.min(clock.now() + 200_000)), queued),
                _ => (wait, queued),
            }
        } else if core.inflight > 0 {
            (if starved { Wait::Until(clock.now() + 200_000) } else { Wait::One }, 0..0)
        } else if starved || (input_open && !stopping) {
            // Nothing to issue or reap, and more may come: wait for a chunk (the one just
            // taken may have had no rows, as an empty push has).
            match input.recv_timeout(Duration::from_millis(20)) {
                Ok(chunk) => core.push(chunk),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => input_open = false,
            }
            continue;
        } else {
            break; // input closed (or stopping) and nothing in flight
        };
        if let Err(e) = core.reap(wait, queued) {
            // Fatal for the engine (not for one I/O): stop and hand back what we have. The
            // rows in flight stay marked incomplete (complete_ns = -1).
            failure = Some(e);
            stopping = true;
            core.inflight = 0;
        }
        // For progress: one relaxed store per enter, read by Python a few times a second.
        completed.store(core.rows_issued - core.inflight as u64, Ordering::Relaxed);
        if !core.retire(&output) {
            stopping = true; // nobody is listening any more
        }
    }
    // Stopped or failed: what remains goes out partially issued, in order.
    for a in core.active.drain(..) {
        let _ = output.send(a.out);
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(Summary { start_ns: t0, rows_issued: core.rows_issued, interrupted: stopping, cpu_ns: thread_cpu_ns() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Completion, Entered};
    use crate::clock::{now_ns, Counting, Monotonic};
    use crate::data::DataPattern;
    use crate::null::NullEngine;
    use std::collections::{HashMap, VecDeque};
    use std::sync::mpsc::{channel, sync_channel};
    use std::sync::Arc;

    fn chunk(base: u64, ts: Vec<i64>) -> Chunk {
        let n = ts.len();
        Chunk::new(base, ts, vec![OP_READ; n], vec![0; n], vec![4096; n], None, 4096).unwrap()
    }

    fn unset() -> AtomicI64 {
        AtomicI64::new(START_UNSET)
    }

    fn replay(mode: Mode, chunks: Vec<Chunk>, depth: usize) -> (Vec<ChunkResult>, Summary) {
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(chunks.len().max(1));
        for c in chunks {
            tx.send(c).unwrap();
        }
        drop(tx);
        let (otx, orx) = channel();
        let stop = AtomicBool::new(false);
        let summary = run(&mut NullEngine::new(depth), &bufs, mode, depth, &unset(), rx, otx, &stop, &AtomicU64::new(0), &Monotonic).unwrap();
        (orx.into_iter().collect(), summary)
    }

    #[test]
    fn chunks_check_every_row() {
        let bad = |op: u8, offset: i64, length: i64| {
            Chunk::new(100, vec![0, 0], vec![OP_READ, op], vec![0, offset], vec![4096, length], None, 8192)
                .err()
                .expect("a bad row passed")
        };
        let e = bad(7, 0, 4096);
        assert_eq!(e.row, 101);
        assert!(e.problem.contains("unknown op 7"), "{e}");
        assert!(bad(OP_READ, -1, 4096).problem.contains("negative offset"));
        assert!(bad(OP_DISCARD, 0, -1).problem.contains("negative length"));
        assert!(bad(OP_WRITE, 0, 8193).problem.contains("longer than the 8192-byte buffers"));
        assert!(bad(OP_READ, i64::MAX - 10, 4096).problem.contains("overflows"));
        // Discards and flushes carry no data: any length the offset leaves room for.
        assert!(Chunk::new(0, vec![0], vec![OP_DISCARD], vec![0], vec![(4 << 30) + (1 << 20)], None, 4096).is_ok());
        assert!(Chunk::new(0, vec![0, 0], vec![0, 0], vec![0], vec![0, 0], None, 4096).is_err());
    }

    #[test]
    fn discards_keep_their_64_bit_length() {
        let bufs = Buffers::new(4096, 1, DataPattern::Zeros);
        let len = (4i64 << 30) + (1 << 20);
        let c = Chunk::new(0, vec![0], vec![OP_DISCARD], vec![4096], vec![len], None, 4096).unwrap();
        let io = c.io(0, &bufs);
        assert!(matches!(io.kind, IoKind::Discard { len: l } if l == len as u64));
        assert_eq!(io.bytes(), len);
        let (out, _) = replay(Mode::Afap, vec![c], 1);
        assert_eq!(out[0].result[0], len);
    }

    #[test]
    fn chunks_come_back_in_order_complete() {
        let chunks = (0..5).map(|k| chunk(k * 100, (0..100).map(|i| (k as i64 * 100 + i) * 1000).collect())).collect();
        let (out, summary) = replay(Mode::Original { speed: 1.0 }, chunks, 16);
        assert_eq!(summary.rows_issued, 500);
        assert!(!summary.interrupted);
        assert_eq!(out.iter().map(|r| r.base).collect::<Vec<_>>(), vec![0, 100, 200, 300, 400]);
        for r in &out {
            assert_eq!(r.issued, 100);
            assert!(r.result.iter().all(|&x| x == 4096));
            assert!(r.complete_ns.iter().zip(&r.issue_ns).all(|(c, i)| c >= i && *i >= 0));
        }
    }

    #[test]
    fn empty_chunks_do_not_end_the_input() {
        for mode in [Mode::Afap, Mode::Original { speed: 1.0 }] {
            let chunks = vec![chunk(0, vec![]), chunk(0, vec![]), chunk(0, vec![0])];
            let (out, summary) = replay(mode, chunks, 4);
            assert_eq!(summary.rows_issued, 1);
            assert_eq!(out.iter().map(|r| r.issued).sum::<usize>(), 1);
        }
    }

    #[test]
    fn original_mode_never_issues_early_and_records_deadlines() {
        let ts: Vec<i64> = (0..200).map(|i| i * 50_000).collect(); // 20k IOPS for 10 ms
        let (out, _) = replay(Mode::Original { speed: 2.0 }, vec![chunk(0, ts.clone())], 8);
        let r = &out[0];
        for i in 0..ts.len() {
            assert_eq!(r.intended_ns[i], ts[i] / 2);
            assert!(r.issue_ns[i] >= r.intended_ns[i], "row {i} issued early");
        }
        // Monotone issue order.
        assert!(r.issue_ns.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_given_start_is_waited_for_and_shared() {
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(1);
        tx.send(chunk(0, vec![0, 1000])).unwrap();
        drop(tx);
        let (otx, orx) = channel();
        let start = now_ns() + 20_000_000;
        let at = AtomicI64::new(start);
        let summary =
            run(&mut NullEngine::new(4), &bufs, Mode::Afap, 4, &at, rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &Monotonic).unwrap();
        assert_eq!(summary.start_ns, start);
        assert!(now_ns() >= start);
        let out: Vec<_> = orx.into_iter().collect();
        assert!(out[0].issue_ns.iter().all(|&t| t >= 0), "issued before the shared start");
    }

    #[test]
    fn afap_ignores_timestamps() {
        let ts: Vec<i64> = (0..1000).map(|i| i * 1_000_000_000).collect(); // 1000 s of trace
        let start = now_ns();
        let (out, _) = replay(Mode::Afap, vec![chunk(0, ts)], 32);
        assert!(now_ns() - start < 5_000_000_000);
        assert_eq!(out[0].issued, 1000);
        // Due when queued; issued when the engine submitted it, no earlier.
        assert!(out[0].intended_ns.iter().zip(&out[0].issue_ns).all(|(d, i)| d <= i && i - d < 1_000_000_000));
    }

    #[test]
    fn a_closed_loop_on_the_null_engine_takes_each_rows_due_time_from_the_enter_before() {
        // At QD1 row i is due when row i - 1 completed (the null engine: when its enter
        // returned), so the loop reads the clock only after a chunk comes or goes.
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(2);
        tx.send(chunk(0, vec![0; 1000])).unwrap();
        tx.send(chunk(1000, vec![0; 1000])).unwrap();
        drop(tx);
        let (otx, orx) = channel();
        let clock = Counting::default();
        run(&mut NullEngine::new(1), &bufs, Mode::Afap, 1, &unset(), rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &clock).unwrap();
        let out: Vec<ChunkResult> = orx.into_iter().collect();
        let reads = clock.reads();
        assert!(reads <= 8, "{reads} clock reads for 2,000 rows");
        for r in &out {
            assert_eq!(r.issued, 1000);
            assert_eq!(r.issue_ns, r.complete_ns);
            for i in 1..1000 {
                assert_eq!(r.intended_ns[i], r.complete_ns[i - 1], "row {i}");
                assert!(r.issue_ns[i] >= r.intended_ns[i]);
            }
        }
        // A new chunk's first row is due when the loop took it, after the last row before.
        assert!(out[1].intended_ns[0] >= out[0].complete_ns[999]);
        // With a service time the engine sleeps to each completion after submitting: a row is
        // due when the enter that saw the completion before it woke, at or after that
        // completion's time (the model's), and still without a clock read of its own.
        let (tx, rx) = sync_channel(1);
        tx.send(chunk(0, vec![0; 100])).unwrap();
        drop(tx);
        let (otx, orx) = channel();
        let clock = Counting::default();
        run(&mut NullEngine::with_service(1, 1_000), &bufs, Mode::Afap, 1, &unset(), rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &clock).unwrap();
        assert!(clock.reads() <= 8);
        let r = orx.recv().unwrap();
        assert!((1..100).all(|i| r.intended_ns[i] >= r.complete_ns[i - 1] && r.complete_ns[i] - r.issue_ns[i] >= 1_000));
    }

    #[test]
    fn a_closed_loop_on_io_uring_takes_each_rows_due_time_from_the_enter_that_reaped_the_one_before() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join(format!("run-uring-test-{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.write_all(&vec![5u8; 1 << 20]).unwrap();
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let mut engine = match crate::uring::UringEngine::new(file.as_raw_fd(), 1, &bufs, false) {
            Ok(e) => e,
            Err(e) => return eprintln!("skipped: io_uring unavailable here ({e})"),
        };
        let (tx, rx) = sync_channel(2);
        for base in [0, 500] {
            let n = 500;
            let offset = (0..n).map(|i| (i as i64 * 37 % 256) * 4096).collect();
            tx.send(Chunk::new(base, vec![0; n], vec![OP_READ; n], offset, vec![4096; n], None, 4096).unwrap()).unwrap();
        }
        drop(tx);
        let (otx, orx) = channel();
        let clock = Counting::default();
        run(&mut engine, &bufs, Mode::Afap, 1, &unset(), rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &clock).unwrap();
        let reads = clock.reads();
        assert!(reads <= 8, "{reads} clock reads of the loop's own for 1,000 I/Os");
        for r in orx.into_iter() {
            assert!(r.result.iter().all(|&x| x == 4096));
            for i in 1..500 {
                assert_eq!(r.intended_ns[i], r.complete_ns[i - 1], "row {i}");
                assert!(r.issue_ns[i] >= r.intended_ns[i] && r.complete_ns[i] >= r.issue_ns[i]);
            }
        }
    }

    #[test]
    fn stop_returns_partial_chunks_marked() {
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(2);
        // One row now, one an hour later: stopping must not wait for the second.
        tx.send(chunk(0, vec![0, 3_600_000_000_000])).unwrap();
        let (otx, orx) = channel();
        let stop = AtomicBool::new(false);
        let start = unset();
        let summary = std::thread::scope(|s| {
            let h = s.spawn(|| {
                run(&mut NullEngine::new(4), &bufs, Mode::Original { speed: 1.0 }, 4, &start, rx, otx, &stop, &AtomicU64::new(0), &Monotonic)
            });
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
            h.join().unwrap().unwrap()
        });
        drop(tx);
        assert!(summary.interrupted);
        let out: Vec<_> = orx.into_iter().collect();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].issued, 1);
        assert_eq!(out[0].issue_ns[1], -1);
        assert_eq!(out[0].result[0], 4096);
    }

    #[test]
    fn a_stop_is_seen_while_waiting_for_a_start_an_hour_ahead() {
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(1);
        tx.send(chunk(0, vec![0, 1000])).unwrap();
        let (otx, orx) = channel();
        let (stop, start) = (AtomicBool::new(false), AtomicI64::new(now_ns() + 3_600_000_000_000));
        let begun = now_ns();
        let summary = std::thread::scope(|s| {
            let h = s.spawn(|| run(&mut NullEngine::new(4), &bufs, Mode::Original { speed: 1.0 }, 4, &start, rx, otx, &stop, &AtomicU64::new(0), &Monotonic));
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
            h.join().unwrap().unwrap()
        });
        drop(tx);
        assert!(now_ns() - begun < 10_000_000_000, "the stop waited for the start");
        assert!(summary.interrupted);
        let out: Vec<_> = orx.into_iter().collect();
        assert_eq!((out.len(), out[0].issued, out[0].issue_ns[0]), (1, 0, -1));
    }

    #[test]
    fn depth_bounds_in_flight() {
        // With the null engine every enter completes everything, so track via a wrapper.
        struct Counting {
            inner: NullEngine,
            staged: usize,
            max: usize,
        }
        impl Engine for Counting {
            unsafe fn queue(&mut self, io: Io) {
                self.staged += 1;
                self.max = self.max.max(self.staged);
                // SAFETY: the same contract, passed on.
                unsafe { self.inner.queue(io) }
            }
            fn enter(&mut self, w: Wait, d: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
                let e = self.inner.enter(w, d)?;
                self.staged -= e.reaped;
                Ok(e)
            }
        }
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(1);
        tx.send(chunk(0, vec![0; 1000])).unwrap();
        drop(tx);
        let (otx, _orx) = channel();
        let mut e = Counting { inner: NullEngine::new(8), staged: 0, max: 0 };
        run(&mut e, &bufs, Mode::Afap, 8, &unset(), rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &Monotonic).unwrap();
        assert_eq!(e.max, 8);
    }

    #[test]
    fn a_closed_loop_queues_at_most_the_engines_submit_batch_before_each_enter() {
        // Counts the rows queued between two enters; the null engine completes them all in
        // the enter, so a batch below the depth is the engine's choice, not the depth's.
        struct Batched {
            inner: NullEngine,
            batch: usize,
            queued: usize,
            most: usize,
            enters: usize,
        }
        impl Engine for Batched {
            fn submit_batch(&self, _depth: usize) -> usize {
                self.batch
            }
            unsafe fn queue(&mut self, io: Io) {
                self.queued += 1;
                self.most = self.most.max(self.queued);
                // SAFETY: the same contract, passed on.
                unsafe { self.inner.queue(io) }
            }
            fn enter(&mut self, w: Wait, d: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
                self.queued = 0;
                self.enters += 1;
                self.inner.enter(w, d)
            }
        }
        for batch in [1, 3, 8] {
            let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
            let (tx, rx) = sync_channel(1);
            tx.send(chunk(0, vec![0; 999])).unwrap();
            drop(tx);
            let (otx, orx) = channel();
            let mut e = Batched { inner: NullEngine::new(8), batch, queued: 0, most: 0, enters: 0 };
            run(&mut e, &bufs, Mode::Afap, 8, &unset(), rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &Monotonic).unwrap();
            assert_eq!(e.most, batch, "batch {batch}");
            assert!(e.enters >= 999 / batch, "batch {batch}: {} enters", e.enters);
            let out: Vec<_> = orx.into_iter().collect();
            assert_eq!(out.iter().map(|c| c.issued).sum::<usize>(), 999);
            assert!(out.iter().all(|c| c.complete_ns.iter().all(|&t| t >= 0)));
        }
    }

    /// A clock that moves only when the test engine moves it.
    struct FakeClock(Arc<AtomicI64>);

    impl Clock for FakeClock {
        fn now(&self) -> i64 {
            self.0.load(Ordering::Relaxed)
        }
        fn sleep_until(&self, t: i64) -> i64 {
            self.0.fetch_max(t, Ordering::Relaxed).max(t)
        }
        fn spin_until(&self, t: i64) -> i64 {
            self.sleep_until(t)
        }
    }

    /// An engine on the fake clock that completes each I/O the instant it is submitted, but
    /// stays busy for `stalls[token]` after submitting a batch holding that row (as an engine
    /// thread held up by a slow submission or descheduled would). Waiting for a deadline
    /// moves the clock there; a spin (Wait::No, nothing to do) moves it 1 us.
    struct Stalling {
        clock: Arc<AtomicI64>,
        stalls: HashMap<u64, i64>,
        staged: Vec<u64>,
    }

    impl Engine for Stalling {
        unsafe fn queue(&mut self, io: Io) {
            self.staged.push(io.token);
        }
        fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
            let now = self.clock.load(Ordering::Relaxed);
            if self.staged.is_empty() {
                match wait {
                    Wait::Until(t) => self.clock.fetch_max(t, Ordering::Relaxed),
                    _ => self.clock.fetch_add(1_000, Ordering::Relaxed),
                };
                return Ok(Entered::default());
            }
            let (mut busy, reaped) = (0, self.staged.len());
            for token in self.staged.drain(..) {
                done(Completion { token, result: 4096, issue_ns: None, complete_ns: now });
                busy = busy.max(self.stalls.get(&token).copied().unwrap_or(0));
            }
            self.clock.fetch_add(busy, Ordering::Relaxed);
            Ok(Entered { reaped, submitted_ns: Some(now), seen_ns: None })
        }
    }

    #[test]
    fn each_io_is_issued_at_its_deadline_or_when_the_engine_is_free() {
        // 300 rows 1 ms apart at speed 2 (so due every 500 us); three rows hold the engine up
        // for 3.5 ms, 800 us and 20 ms.
        let n = 300;
        let ts: Vec<i64> = (0..n).map(|i| i * 1_000_000).collect();
        let stalls = HashMap::from([(10u64, 3_500_000i64), (50, 800_000), (200, 20_000_000)]);
        let clock = Arc::new(AtomicI64::new(1_000_000_000));
        let mut engine = Stalling { clock: Arc::clone(&clock), stalls: stalls.clone(), staged: Vec::new() };
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(2);
        tx.send(chunk(0, ts[..100].to_vec())).unwrap();
        tx.send(chunk(100, ts[100..].to_vec())).unwrap();
        drop(tx);
        let (otx, orx) = channel();
        let mode = Mode::Original { speed: 2.0 };
        run(&mut engine, &bufs, mode, 64, &unset(), rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &FakeClock(clock)).unwrap();
        let out: Vec<ChunkResult> = orx.into_iter().collect();
        let issue: Vec<i64> = out.iter().flat_map(|r| r.issue_ns.clone()).collect();
        let intended: Vec<i64> = out.iter().flat_map(|r| r.intended_ns.clone()).collect();
        let mut free = 0; // when the engine was next free, relative to the start
        for i in 0..n as usize {
            let deadline = ts[i] / 2;
            assert_eq!(intended[i], deadline);
            let expected = deadline.max(free);
            // A spin step of the fake clock is 1 us.
            assert!(
                issue[i] >= expected && issue[i] <= expected + 1_000,
                "row {i}: issued at {} us, expected max(deadline {} us, engine free {} us)",
                issue[i] / 1000,
                deadline / 1000,
                free / 1000
            );
            free = free.max(issue[i] + stalls.get(&(i as u64)).copied().unwrap_or(0));
        }
        // The stalls delayed only the rows due while the engine was busy.
        assert_eq!(issue[20], intended[20]);
        assert_eq!(issue[250], intended[250]);
    }

    /// A device of fixed latency on the fake clock: each I/O completes exactly `service` after
    /// the `enter` that submits it, failing with `fail[token]` if given. Waits move the clock
    /// straight to the next completion or deadline (a timed wait is for a deadline SPIN_NS
    /// later, see `issue`), so a causal replay runs exactly on the model's schedule.
    struct Device {
        clock: Arc<AtomicI64>,
        service: i64,
        fail: HashMap<u64, i64>,
        staged: Vec<u64>,
        pending: VecDeque<(u64, i64)>,
    }

    impl Device {
        fn new(clock: &Arc<AtomicI64>, service: i64) -> Self {
            Self { clock: Arc::clone(clock), service, fail: HashMap::new(), staged: Vec::new(), pending: VecDeque::new() }
        }
    }

    impl Engine for Device {
        unsafe fn queue(&mut self, io: Io) {
            self.staged.push(io.token);
        }
        fn enter(&mut self, wait: Wait, done: &mut dyn FnMut(Completion)) -> io::Result<Entered> {
            let now = self.clock.load(Ordering::Relaxed);
            let (at, submitted) = (now, !self.staged.is_empty());
            for token in self.staged.drain(..) {
                self.pending.push_back((token, now + self.service));
            }
            let first = self.pending.front().map(|p| p.1);
            let to = match (wait, first) {
                (Wait::One, Some(f)) => f,
                (Wait::Until(t), Some(f)) => (t + SPIN_NS).min(f),
                (Wait::Until(t), None) => t + SPIN_NS,
                // A spin towards a deadline less than SPIN_NS away: 1 ns a turn, to land on it.
                (Wait::No, _) if !submitted => now + 1,
                _ => now,
            };
            self.clock.fetch_max(to, Ordering::Relaxed);
            let now = self.clock.load(Ordering::Relaxed);
            let mut reaped = 0;
            while self.pending.front().is_some_and(|p| p.1 <= now) {
                let (token, at) = self.pending.pop_front().unwrap();
                let result = self.fail.get(&token).copied().unwrap_or(4096);
                done(Completion { token, result, issue_ns: None, complete_ns: at });
                reaped += 1;
            }
            Ok(Entered { reaped, submitted_ns: submitted.then_some(at), seen_ns: None })
        }
    }

    /// Replays rows (ts, parent rows back, think) in causal mode on `engine`, in chunks of
    /// `step`; returns (intended, issue, complete, result) per row.
    fn causal(engine: &mut dyn Engine, clock: &Arc<AtomicI64>, rows: &[(i64, u32, i64)], step: usize, speed: f64, think_scale: f64) -> [Vec<i64>; 4] {
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let chunks: Vec<Chunk> = rows
            .chunks(step)
            .enumerate()
            .map(|(k, part)| {
                let n = part.len();
                chunk((k * step) as u64, part.iter().map(|r| r.0).collect())
                    .with_deps(part.iter().map(|r| r.1).collect(), vec![0; n], part.iter().map(|r| r.2).collect(), think_scale)
                    .unwrap()
            })
            .collect();
        let (tx, rx) = sync_channel(chunks.len().max(1));
        for c in chunks {
            tx.send(c).unwrap();
        }
        drop(tx);
        let (otx, orx) = channel();
        let start = AtomicI64::new(clock.load(Ordering::Relaxed));
        let mode = Mode::Causal { speed, think_scale };
        run(engine, &bufs, mode, 1024, &start, rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &FakeClock(Arc::clone(clock))).unwrap();
        let out: Vec<ChunkResult> = orx.into_iter().collect();
        let col = |f: fn(&ChunkResult) -> &Vec<i64>| out.iter().flat_map(|r| f(r).clone()).collect::<Vec<i64>>();
        [col(|r| &r.intended_ns), col(|r| &r.issue_ns), col(|r| &r.complete_ns), col(|r| &r.result)]
    }

    #[test]
    fn causal_recovers_a_closed_loop_models_schedule_exactly() {
        // K threads, each issuing its next I/O a random think time after its previous one
        // completed on a device of fixed latency; on a device of the same latency the causal
        // replay issues every I/O exactly when the model did, in any chunking.
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for case in 0..40 {
            let (threads, ios, service) = (1 + rand(6) as usize, 1 + rand(40) as usize, 1_000 + rand(500_000) as i64);
            // Think times below 1 us, or of milliseconds: with the fake clock a spin towards a
            // deadline moves 1 ns a turn, so think times in between would make the test slow.
            let (think_min, think_span) = if case % 2 == 0 { (0, 1_000) } else { (1_000_000, 5_000_000) };
            let mut rows_model: Vec<(i64, usize, usize, i64)> = Vec::new(); // (ts, thread, j, think)
            for k in 0..threads {
                let mut t = rand(1_000_000) as i64;
                for j in 0..ios {
                    let think = if j == 0 { 0 } else { think_min + rand(think_span) as i64 };
                    t += think;
                    rows_model.push((t, k, j, think));
                    t += service;
                }
            }
            rows_model.sort();
            let pos: HashMap<(usize, usize), usize> = rows_model.iter().enumerate().map(|(i, m)| ((m.1, m.2), i)).collect();
            let rows: Vec<(i64, u32, i64)> = rows_model
                .iter()
                .enumerate()
                .map(|(i, m)| (m.0, if m.2 == 0 { 0 } else { (i - pos[&(m.1, m.2 - 1)]) as u32 }, m.3))
                .collect();
            let clock = Arc::new(AtomicI64::new(1_000_000_000));
            let step = 1 + rand(rows.len() as u64) as usize;
            let [intended, issue, complete, result] = causal(&mut Device::new(&clock, service), &clock, &rows, step, 1.0, 1.0);
            for (i, m) in rows_model.iter().enumerate() {
                assert_eq!(intended[i], m.0, "case {case} row {i}: intended");
                assert_eq!(issue[i], m.0, "case {case} row {i}: issued off the model's schedule");
                assert_eq!(complete[i], m.0 + service);
                assert_eq!(result[i], 4096);
            }
        }
    }

    #[test]
    fn a_waiting_row_never_holds_back_a_later_independent_one() {
        // Row 1 waits for row 0 (1 ms of service); row 2, due at 10 us, goes first.
        let clock = Arc::new(AtomicI64::new(0));
        let rows = [(0, 0, 0), (5_000, 1, 0), (10_000, 0, 0)];
        let [intended, issue, _, _] = causal(&mut Device::new(&clock, 1_000_000), &clock, &rows, 3, 1.0, 1.0);
        assert_eq!(issue, vec![0, 1_000_000, 10_000]);
        assert_eq!(intended, issue);
    }

    #[test]
    fn think_time_and_speed_scale_apart_and_a_failed_parent_still_releases_its_child() {
        let clock = Arc::new(AtomicI64::new(0));
        let mut dev = Device::new(&clock, 100_000);
        dev.fail.insert(0, -5);
        // Row 1 waits for row 0, then 40 us of think; row 2 is a root at 1 ms.
        let rows = [(0, 0, 0), (140_000, 1, 40_000), (1_000_000, 0, 0)];
        let [intended, issue, complete, result] = causal(&mut dev, &clock, &rows, 2, 2.0, 0.5);
        assert_eq!(result[0], -5);
        assert_eq!(complete[0], 100_000);
        assert_eq!(intended, vec![0, 120_000, 500_000]);
        assert_eq!(issue, intended);
    }

    #[test]
    fn causal_columns_are_checked() {
        let c = || chunk(10, vec![0, 1]);
        assert!(c().with_deps(vec![0], vec![0, 0], vec![0, 0], 1.0).is_err());
        let e = c().with_deps(vec![0, WINDOW as u32], vec![0, 0], vec![0, 0], 1.0).err().unwrap();
        assert_eq!(e.row, 11);
        assert!(c().with_deps(vec![0, 0], vec![0, 0], vec![0, -1], 1.0).err().unwrap().problem.contains("negative think"));
        // A year of think time passes, a nanosecond more does not, nor a year scaled up.
        assert!(c().with_deps(vec![0, 1], vec![0, 0], vec![0, MAX_THINK_NS], 1.0).is_ok());
        let e = c().with_deps(vec![0, 1], vec![0, 0], vec![0, MAX_THINK_NS + 1], 1.0).err().unwrap();
        assert_eq!(e.row, 11);
        assert!(e.problem.contains("more than a year"), "{}", e.problem);
        assert!(c().with_deps(vec![0, 1], vec![0, 0], vec![0, MAX_THINK_NS], 1.5).is_err());
        assert!(c().with_deps(vec![0, 1], vec![0, 0], vec![0, i64::MAX], 1e308).is_err());
        assert!(c().with_deps(vec![0, 1], vec![0, 0], vec![0, i64::MAX], 0.0).is_ok());
    }
}

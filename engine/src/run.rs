//! The core of a replay: paces rows to their deadlines, hands them to an engine, and writes
//! every row's intended, issue and completion time and result into arrays preallocated per
//! chunk. The trace arrives as a stream of chunks; finished chunks leave in order.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::Duration;

use crate::backend::{Engine, Io, Wait, FLAG_FUA, OP_DISCARD, OP_WRITE};
use crate::clock::{intended_ns, now_ns, thread_cpu_ns, SPIN_NS};
use crate::data::Buffers;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Open loop: row i is due at start + ts_ns[i] / speed.
    Original { speed: f64 },
    /// Closed loop: as fast as possible, with up to `depth` in flight.
    Afap,
}

/// Never block longer than this, so a stop request is seen promptly even in a long idle gap.
const MAX_BLOCK_NS: i64 = 50_000_000;

/// A slice of the trace: the columns the engine needs, rows `base..base + len`.
pub struct Chunk {
    pub base: u64,
    pub ts_ns: Vec<i64>,
    pub op: Vec<u8>,
    pub offset: Vec<i64>,
    pub length: Vec<i64>,
    pub flags: Option<Vec<u8>>,
}

impl Chunk {
    pub fn len(&self) -> usize {
        self.op.len()
    }
}

/// What the engine measured for one chunk. Rows at and after `issued` were never issued
/// (the run was stopped) and hold -1.
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

/// Run until the input closes and everything issued has completed, or until `stop` is set
/// (then in-flight I/Os are reaped and the unissued rest is returned marked). Times in the
/// results are relative to the start: `start_ns` on the monotonic clock when given (several
/// runs in parallel share one start), else when the first chunk arrives.
#[allow(clippy::too_many_arguments)]
pub fn run(
    engine: &mut dyn Engine,
    bufs: &Buffers,
    mode: Mode,
    depth: usize,
    start_ns: Option<i64>,
    input: Receiver<Chunk>,
    output: Sender<ChunkResult>,
    stop: &AtomicBool,
) -> io::Result<Summary> {
    engine.start()?;
    let mut active: VecDeque<Active> = VecDeque::new();
    let mut input_open = true;
    let first = loop {
        if stop.load(Ordering::Relaxed) {
            break None;
        }
        match input.recv_timeout(Duration::from_millis(50)) {
            Ok(chunk) => break Some(chunk),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break None,
        }
    };
    let Some(first) = first else {
        return Ok(Summary {
            start_ns: now_ns(),
            rows_issued: 0,
            interrupted: stop.load(Ordering::Relaxed),
            cpu_ns: thread_cpu_ns(),
        });
    };
    active.push_back(Active::new(first));
    let t0 = start_ns.unwrap_or_else(now_ns);
    while now_ns() < t0 - SPIN_NS {
        std::thread::sleep(Duration::from_nanos((t0 - SPIN_NS - now_ns()).clamp(0, MAX_BLOCK_NS) as u64));
    }
    while now_ns() < t0 {
        std::hint::spin_loop();
    }
    let mut inflight = 0usize;
    let mut rows_issued = 0u64;
    let mut stopping = false;
    let mut failure = None;

    loop {
        stopping = stopping || stop.load(Ordering::Relaxed);
        // Make sure the newest chunk has a row to issue, pulling the next one if needed.
        let mut starved = false;
        if !stopping && active.back().map_or(true, Active::exhausted) && input_open {
            match input.try_recv() {
                Ok(chunk) => active.push_back(Active::new(chunk)),
                Err(TryRecvError::Empty) => starved = true,
                Err(TryRecvError::Disconnected) => input_open = false,
            }
        }
        let has_next = !stopping && active.back().is_some_and(|a| !a.exhausted());

        let wait = if has_next && inflight < depth {
            let a = active.back_mut().expect("has_next");
            let now = now_ns() - t0;
            let due = |i: usize| match mode {
                Mode::Original { speed } => intended_ns(a.chunk.ts_ns[i], speed),
                Mode::Afap => now,
            };
            let next_due = due(a.out.issued);
            if next_due > now + SPIN_NS {
                Wait::Until(t0 + (next_due - SPIN_NS).min(now + MAX_BLOCK_NS))
            } else if next_due > now {
                Wait::No // spin: reap completions while the deadline comes
            } else {
                // Issue every row that is due, as one submission.
                let mut i = a.out.issued;
                while i < a.chunk.len() && inflight < depth && due(i) <= now {
                    let op = a.chunk.op[i];
                    let len = a.chunk.length[i] as u32;
                    let token = a.chunk.base + i as u64;
                    let buf = if op == OP_WRITE { bufs.write_source(token, len as usize) } else { bufs.read_destination(token) };
                    let fua = a.chunk.flags.as_ref().is_some_and(|f| f[i] & FLAG_FUA != 0);
                    engine.queue(Io { token, op, fua, offset: a.chunk.offset[i] as u64, len, buf });
                    a.out.intended_ns[i] = due(i);
                    a.out.issue_ns[i] = now;
                    i += 1;
                    inflight += 1;
                }
                let n = i - a.out.issued;
                a.out.issued = i;
                a.outstanding += n;
                rows_issued += n as u64;
                if mode == Mode::Afap && inflight >= depth { Wait::One } else { Wait::No }
            }
        } else if inflight > 0 {
            if starved { Wait::Until(now_ns() + 200_000) } else { Wait::One }
        } else if starved {
            match input.recv_timeout(Duration::from_millis(20)) {
                Ok(chunk) => active.push_back(Active::new(chunk)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => input_open = false,
            }
            continue;
        } else {
            break; // input closed (or stopping) and nothing in flight
        };

        let reaped = engine.enter(wait, &mut |token, result, at| {
            let a = active
                .iter_mut()
                .find(|a| token >= a.chunk.base && token < a.chunk.base + a.chunk.len() as u64)
                .expect("completion for a row the engine never issued");
            let i = (token - a.chunk.base) as usize;
            let op = a.chunk.op[i];
            a.out.complete_ns[i] = at - t0;
            // A discard or punch-hole reports 0 on success; record the bytes it covered.
            a.out.result[i] = if op == OP_DISCARD && result == 0 { a.chunk.length[i] } else { result };
            a.outstanding -= 1;
        });
        match reaped {
            Ok(n) => inflight -= n,
            Err(e) => {
                // Fatal for the engine (not for one I/O): stop and hand back what we have.
                // The rows in flight stay marked incomplete (complete_ns = -1).
                failure = Some(e);
                stopping = true;
                inflight = 0;
            }
        }

        while active.front().is_some_and(|a| a.exhausted() && a.outstanding == 0) {
            let a = active.pop_front().expect("front");
            if output.send(a.out).is_err() {
                stopping = true; // nobody is listening any more
            }
        }
    }
    // Stopped or failed: what remains goes out partially issued, in order.
    for a in active.drain(..) {
        let _ = output.send(a.out);
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(Summary {
            start_ns: t0,
            rows_issued,
            interrupted: stopping,
            cpu_ns: thread_cpu_ns(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DataPattern;
    use crate::backend::OP_READ;
    use crate::null::NullEngine;
    use std::sync::mpsc::{channel, sync_channel};

    fn chunk(base: u64, ts: Vec<i64>) -> Chunk {
        let n = ts.len();
        Chunk { base, ts_ns: ts, op: vec![OP_READ; n], offset: vec![0; n], length: vec![4096; n], flags: None }
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
        let summary = run(&mut NullEngine::new(depth), &bufs, mode, depth, None, rx, otx, &stop).unwrap();
        (orx.into_iter().collect(), summary)
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
        let summary = run(&mut NullEngine::new(4), &bufs, Mode::Afap, 4, Some(start), rx, otx, &AtomicBool::new(false)).unwrap();
        assert_eq!(summary.start_ns, start);
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
        assert_eq!(out[0].intended_ns, out[0].issue_ns);
    }

    #[test]
    fn stop_returns_partial_chunks_marked() {
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(2);
        // One row now, one an hour later: stopping must not wait for the second.
        tx.send(chunk(0, vec![0, 3_600_000_000_000])).unwrap();
        let (otx, orx) = channel();
        let stop = AtomicBool::new(false);
        let summary = std::thread::scope(|s| {
            let h = s.spawn(|| run(&mut NullEngine::new(4), &bufs, Mode::Original { speed: 1.0 }, 4, None, rx, otx, &stop));
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
    fn depth_bounds_in_flight() {
        // With the null engine every enter completes everything, so track via a wrapper.
        struct Counting { inner: NullEngine, staged: usize, max: usize }
        impl Engine for Counting {
            fn queue(&mut self, io: Io) {
                self.staged += 1;
                self.max = self.max.max(self.staged);
                self.inner.queue(io)
            }
            fn enter(&mut self, w: Wait, d: &mut dyn FnMut(u64, i64, i64)) -> io::Result<usize> {
                let n = self.inner.enter(w, d)?;
                self.staged -= n;
                Ok(n)
            }
        }
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(1);
        tx.send(chunk(0, vec![0; 1000])).unwrap();
        drop(tx);
        let (otx, _orx) = channel();
        let mut e = Counting { inner: NullEngine::new(8), staged: 0, max: 0 };
        run(&mut e, &bufs, Mode::Afap, 8, None, rx, otx, &AtomicBool::new(false)).unwrap();
        assert_eq!(e.max, 8);
    }
}

//! The psync pool: open-loop and AFAP replay with no hand-off between threads. A thread claims
//! the next row, waits for its deadline itself (sleeping, then spinning the last SPIN_NS;
//! AFAP: not at all), makes the system call and writes the row's results in place. No I/O
//! crosses a thread, no lock is taken per I/O, and a thread held up in one I/O (or off its
//! CPU) delays no other row: another thread takes the next. With a thread per CPU, open loop
//! runs as leaders and a follower: only a leader claims rows, so the rows go to the threads
//! that spin, and the follower leads only while a leader is held up (see `follow`).

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::backend::{Completion, Io};
use crate::clock::{intended_ns, set_precise_timer_slack, thread_cpu_ns, Clock, LONG_SPIN_NS, SPIN_NS};
use crate::data::Buffers;
use crate::psync::perform;
use crate::run::{first_chunk, stopped, wait_or_stop, Chunk, ChunkResult, Mode, Summary, MAX_BLOCK_NS};

/// Starts one I/O's system call and reports its completion, on the calling thread.
pub trait Issuer: Sync {
    /// `at` is the caller's last clock read, just before: the I/O's issue time; `thread` the
    /// calling pool thread's index.
    fn issue(&self, io: &Io, at: i64, thread: usize) -> Completion;
    /// Whether the process's other threads keep off the leaders' CPUs while an open loop runs
    /// (`KeepOff`): the real engine's; the tests' issuers leave the test process's threads be.
    fn keeps_others_off(&self) -> bool {
        false
    }
}

/// pread/pwrite/fdatasync/discard on the run's target, pool thread k through `fds[k % len]`:
/// descriptors of the target each opened on its own (`PoolSize::files`), not duplicates. Every
/// system call on a descriptor counts a reference on its open file, and with one shared by two
/// threads on two CPUs that counter's cache line, which the call also reads the file's
/// operations from, crossed between the CPUs with every I/O: bench/floor.c's two pread loops
/// on zram took 7 % less CPU per I/O each on a file of its own (perf, 3 alternating pairs; fdget
/// and fput 2.4-3.5 % of the samples shared, 0.9-1.2 % apart). fio's jobs open their own too.
pub struct Psync {
    pub fds: Vec<RawFd>,
    pub is_block: bool,
}

impl Issuer for Psync {
    #[inline]
    fn issue(&self, io: &Io, at: i64, thread: usize) -> Completion {
        perform(self.fds[thread % self.fds.len()], io, self.is_block, at)
    }

    fn keeps_others_off(&self) -> bool {
        true
    }
}

/// How many threads the pool runs, and how many of them may spin towards a deadline at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolSize {
    pub threads: usize,
    pub spinners: usize,
}

/// The pool's threads: one per CPU for a driver that runs each I/O on the CPU that submits it
/// (zram, brd: more threads than CPUs only queue for them), else one per I/O of `depth`. A
/// spinning thread holds its CPU, so at most one fewer than the CPUs spin at once: one is left
/// for the thread that takes the results (on two CPUs, two pool threads spinning together
/// leave Python's thread none for up to SPIN_NS) and for the I/Os of the threads that do not
/// spin.
pub fn pool_size(depth: usize, sync_driver: bool) -> PoolSize {
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    PoolSize { threads: if sync_driver { cpus } else { depth }, spinners: (cpus - 1).max(1) }
}

impl PoolSize {
    /// How many descriptors of the target the pool's threads share out (`Psync`): one per
    /// thread up to one per CPU, as more threads than CPUs are never all on a CPU at once.
    pub fn files(&self, depth: usize) -> usize {
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        self.threads.clamp(1, depth.max(1)).min(cpus)
    }
}

/// AFAP: rows a thread claims at once, so the shared claim counter is touched once per this
/// many I/Os; small enough that the threads finish a run together.
const AFAP_BATCH: usize = 32;
/// Completions a thread counts before adding them to the shared progress counter.
const PROGRESS_EVERY: u64 = 1024;
/// A thread within SPIN_NS of its deadline while the spinners allowed are all spinning sleeps
/// this long at a time (never past its deadline), then tries again to take a spinner's place;
/// a follower looks this often for a leader held in its I/O while the next row is near.
const FOLLOW_NS: i64 = 20_000;
/// How often the run's own thread lays the next chunk out and sends finished results (`tend`).
const TEND: Duration = Duration::from_millis(10);
/// A follower that knows no deadline ahead (every row pushed is claimed, and no leader has
/// one: its claim waits for the next chunk) looks for a free leader's place this often.
const IDLE_FOLLOW_NS: i64 = 1_000_000;

/// A chunk being replayed: rows are claimed by bumping `claimed`; each row's results are
/// written by the one thread that claimed it, then counted in `finished` (Release, once per
/// claim: rows done are rows issued), which the run's own thread reads (Acquire) before it
/// reads the results.
struct Slot {
    chunk: Chunk,
    claimed: AtomicUsize,
    finished: AtomicUsize,
    intended_ns: Vec<AtomicI64>,
    issue_ns: Vec<AtomicI64>,
    complete_ns: Vec<AtomicI64>,
    result: Vec<AtomicI64>,
}

impl Slot {
    fn new(chunk: Chunk) -> Arc<Self> {
        let n = chunk.len();
        let col = |v: i64| (0..n).map(|_| AtomicI64::new(v)).collect();
        Arc::new(Self {
            chunk,
            claimed: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            intended_ns: col(-1),
            issue_ns: col(-1),
            complete_ns: col(-1),
            result: col(0),
        })
    }

    fn done(&self) -> bool {
        self.finished.load(Ordering::Acquire) == self.chunk.len()
    }

    fn result(&self) -> ChunkResult {
        let col = |v: &Vec<AtomicI64>| v.iter().map(|x| x.load(Ordering::Relaxed)).collect();
        ChunkResult {
            base: self.chunk.base,
            intended_ns: col(&self.intended_ns),
            issue_ns: col(&self.issue_ns),
            complete_ns: col(&self.complete_ns),
            result: col(&self.result),
            issued: self.finished.load(Ordering::Acquire),
        }
    }
}

/// A leader's deadline (i64::MAX while it leads no row), on a cache line of its own: written
/// by its thread per row, read by the follower when it looks.
#[repr(align(64))]
struct Leading(AtomicI64);

/// The chunks in play, oldest first (only the newest can have rows left to claim), the next
/// one, and the channels: touched when a thread needs a new chunk, not per I/O.
struct Feed {
    input: Receiver<Chunk>,
    input_open: bool,
    active: VecDeque<Arc<Slot>>,
    /// The next chunk, taken from the input and laid out ahead of its first row by the run's
    /// own thread (`tend`).
    ready: Option<Arc<Slot>>,
    output: Sender<ChunkResult>,
}

struct Pool<'a, C: Clock, I: Issuer> {
    feed: Mutex<Feed>,
    issuer: &'a I,
    bufs: &'a Buffers,
    clock: &'a C,
    mode: Mode,
    t0: i64,
    stop: &'a AtomicBool,
    /// Set when nobody takes results any more: the run ends as if stopped.
    deaf: AtomicBool,
    completed: &'a AtomicU64,
    rows_issued: AtomicU64,
    /// Threads spinning now (leaders, with `leads`), and how many may (PoolSize::spinners).
    spinning: AtomicUsize,
    spinners: usize,
    /// Open loop with at most one thread more than `spinners`: leaders and a follower.
    leads: bool,
    /// Each thread's row while it leads.
    leading: Vec<Leading>,
    /// Pool threads still running.
    live: AtomicUsize,
    /// Leaders and a follower: the CPU each thread keeps to, one each.
    cpus: Vec<usize>,
}

/// Pools started in this process, for `cpus_in_turn`.
static POOLS: AtomicUsize = AtomicUsize::new(0);

/// A CPU for each of a pool's `threads`, all different while there are enough: the CPUs this
/// process may run on, from the next one in turn, so that pools side by side (workers) put
/// their leaders on different CPUs.
fn cpus_in_turn(threads: usize) -> Vec<usize> {
    let cpus = allowed_cpus();
    if cpus.is_empty() {
        return cpus;
    }
    let first = POOLS.fetch_add(1, Ordering::Relaxed);
    (0..threads.min(cpus.len())).map(|k| cpus[(first + k) % cpus.len()]).collect()
}

/// The CPUs the calling thread may run on.
fn allowed_cpus() -> Vec<usize> {
    cpus_of(0)
}

/// The CPUs thread `tid` may run on (0: the calling thread); none if it cannot be asked.
fn cpus_of(tid: libc::pid_t) -> Vec<usize> {
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Keep thread `tid` (0: the calling thread) to `cpus` (best effort: a refusal leaves it
/// where it may run).
fn set_cpus(tid: libc::pid_t, cpus: &[usize]) {
    // SAFETY: `set` is a zeroed cpu_set_t with CPUs below CPU_SETSIZE added.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Keep the calling thread to `cpus`, as one of a pool's own threads (leaders, followers and
/// the run's own thread while it tends), which `KeepOff` leaves where they are.
fn pin_to(cpus: &[usize]) {
    let mut kept = lock(&KEPT_OFF);
    set_cpus(0, cpus);
    // SAFETY: gettid has no preconditions.
    kept.pinned.push(unsafe { libc::gettid() });
}

/// The calling thread is no longer one of a pool's own: back to `cpus` (None: it ends).
fn unpin_to(cpus: Option<&[usize]>) {
    let mut kept = lock(&KEPT_OFF);
    if let Some(cpus) = cpus {
        set_cpus(0, cpus);
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    if let Some(i) = kept.pinned.iter().position(|&t| t == tid) {
        kept.pinned.swap_remove(i);
    }
}

/// The threads of this process now.
fn threads_of_process() -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// The leaders' CPUs of the open-loop pools running now (a CPU once per leader), and what
/// `KeepOff` took from the process's other threads.
struct KeptOff {
    leaders: Vec<usize>,
    /// The CPUs each thread kept off had before (by thread id).
    had: Vec<(libc::pid_t, Vec<usize>)>,
    /// The CPUs taken out of the other threads' at the last `apply`.
    taken: Vec<usize>,
    /// The pools' own threads, each pinned by its pool (`pin_to`): left alone.
    pinned: Vec<libc::pid_t>,
}

static KEPT_OFF: Mutex<KeptOff> = Mutex::new(KeptOff { leaders: Vec::new(), had: Vec::new(), taken: Vec::new(), pinned: Vec::new() });

impl KeptOff {
    /// Every thread of the process but the pools' own to the CPUs it had less the leaders'
    /// (all it had where that leaves none). A thread not seen before that started while some
    /// were taken out inherited its starter's CPUs without them: it had those too.
    fn apply(&mut self) {
        let live = threads_of_process();
        self.had.retain(|(t, _)| live.contains(t));
        for tid in live.into_iter().filter(|t| !self.pinned.contains(t)) {
            let had = match self.had.iter().find(|(t, _)| *t == tid) {
                Some((_, cpus)) => cpus.clone(),
                None => {
                    let mut cpus = cpus_of(tid);
                    if cpus.is_empty() {
                        continue; // ended meanwhile
                    }
                    let missing: Vec<usize> = self.taken.iter().copied().filter(|c| !cpus.contains(c)).collect();
                    cpus.extend(missing);
                    cpus.sort_unstable();
                    self.had.push((tid, cpus.clone()));
                    cpus
                }
            };
            let off: Vec<usize> = had.iter().copied().filter(|c| !self.leaders.contains(c)).collect();
            set_cpus(tid, if off.is_empty() { &had } else { &off });
        }
        self.taken = self.leaders.clone();
        if self.leaders.is_empty() {
            self.had.clear();
        }
    }
}

/// While an open-loop pool runs, the process's other threads (the caller's Python thread,
/// which writes the results' journal, the Parquet encoder, the journal's fsync, pyarrow's and
/// any other library's) keep off its leaders' CPUs, as nothing else of the floor's process
/// shares its one thread's CPU: the scheduler otherwise put them now and then on a leader's
/// CPU, next to the spinning leader, which then waited a tick or more for its CPU (traced at
/// 100k IOPS on zram: the Parquet encoder held it 1.7-6.7 ms at a time, rows up to 6.7 ms
/// late). Threads started meanwhile inherit that from their starter. Dropped, every such
/// thread gets back the CPUs it had (one started meanwhile, those it inherited and the
/// leaders').
struct KeepOff(Vec<usize>);

impl KeepOff {
    fn new(leaders: &[usize]) -> Self {
        let mut kept = lock(&KEPT_OFF);
        kept.leaders.extend(leaders);
        kept.apply();
        Self(leaders.to_vec())
    }
}

impl Drop for KeepOff {
    fn drop(&mut self) {
        let mut kept = lock(&KEPT_OFF);
        for c in &self.0 {
            if let Some(i) = kept.leaders.iter().position(|x| x == c) {
                kept.leaders.swap_remove(i);
            }
        }
        kept.apply();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<C: Clock, I: Issuer> Pool<'_, C, I> {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.deaf.load(Ordering::Relaxed)
    }

    /// The next rows for this thread (one row in open loop, so each goes to the first idle
    /// thread; AFAP_BATCH in AFAP), from `cur` or a newer chunk; None at the end of the input
    /// or on a stop.
    fn claim(&self, cur: &mut Option<Arc<Slot>>, batch: usize) -> Option<(Arc<Slot>, usize, usize)> {
        loop {
            if let Some(s) = cur.as_ref() {
                let n = s.chunk.len();
                let i = s.claimed.fetch_add(batch, Ordering::Relaxed);
                if i < n {
                    return Some((Arc::clone(s), i, (i + batch).min(n)));
                }
            }
            let mut feed = lock(&self.feed);
            // A chunk that is not the newest has no rows left: take the newest if it is new.
            if let Some(back) = feed.active.back() {
                if cur.as_ref().is_none_or(|c| !Arc::ptr_eq(c, back)) {
                    *cur = Some(Arc::clone(back));
                    continue;
                }
            }
            // Ours is the newest and exhausted: the next chunk is the one laid out ahead, or
            // comes from the input (the lock is let go between tries).
            if let Some(s) = feed.ready.take() {
                feed.active.push_back(Arc::clone(&s));
                *cur = Some(s);
                continue;
            }
            if !feed.input_open || self.stopping() {
                return None;
            }
            match feed.input.recv_timeout(Duration::from_millis(20)) {
                Ok(chunk) => {
                    #[cfg(test)]
                    tests::LAID_OUT_BY_A_POOL_THREAD.lock().unwrap().push(chunk.base);
                    let s = Slot::new(chunk);
                    feed.active.push_back(Arc::clone(&s));
                    *cur = Some(s);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    feed.input_open = false;
                    return None;
                }
            }
        }
    }

    /// The run's own thread while the pool's threads run: lays the next chunk out ahead
    /// (`Feed::ready`) and sends the finished chunks' results, in order, every TEND. The
    /// thread that claimed a chunk's first row or issued its last used to do these, between
    /// two rows: a 65,536-row chunk's slot and its results are 2 MB of fresh memory each, and
    /// their page faults held the leader 0.2-3.7 ms at every chunk boundary (at 100k IOPS on
    /// zram, 673 of the 1,222 I/Os over 100 us late in 3 s, traced).
    fn tend(&self) {
        let output = lock(&self.feed).output.clone();
        while self.live.load(Ordering::Acquire) > 0 {
            {
                let mut feed = lock(&self.feed);
                if feed.ready.is_none() && feed.input_open {
                    match feed.input.try_recv() {
                        Ok(chunk) => feed.ready = Some(Slot::new(chunk)),
                        Err(TryRecvError::Empty) => {}
                        Err(TryRecvError::Disconnected) => feed.input_open = false,
                    }
                }
            }
            // Taken off the front under the lock, and sent without it: a thread that needs the
            // next chunk does not wait for a result to be gathered.
            loop {
                let done = {
                    let mut feed = lock(&self.feed);
                    match feed.active.front() {
                        Some(s) if s.done() => feed.active.pop_front(),
                        _ => None,
                    }
                };
                let Some(s) = done else { break };
                if output.send(s.result()).is_err() {
                    self.deaf.store(true, Ordering::Relaxed);
                }
            }
            std::thread::sleep(TEND);
        }
    }

    /// Open loop: waits for deadline `t` and returns the time last read (>= t), or None on a
    /// stop. Sleeps until SPIN_NS before `t`, then spins the rest if fewer than `spinners`
    /// threads spin; else sleeps FOLLOW_NS at a time (rows are claimed in order, so those
    /// spinning have earlier deadlines and are soon done) and tries again, and at its
    /// deadline issues with no spin at all.
    fn wait_for(&self, t: i64) -> Option<i64> {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            let now = self.clock.now();
            if t - now > SPIN_NS {
                self.clock.sleep_until(now + (t - now - SPIN_NS).min(MAX_BLOCK_NS));
                continue;
            }
            let spin = |n: usize| (n < self.spinners).then_some(n + 1);
            if self.spinning.fetch_update(Ordering::Acquire, Ordering::Relaxed, spin).is_ok() {
                let at = self.clock.spin_until(t);
                self.spinning.fetch_sub(1, Ordering::Release);
                return Some(at);
            }
            if now >= t {
                return Some(self.clock.spin_until(t)); // due already: returns at once
            }
            self.clock.sleep_until(t.min(now + FOLLOW_NS));
        }
    }

    /// One thread's life: claim, wait, issue, record, until the input ends or a stop.
    /// Returns the thread's CPU time.
    fn worker(&self, thread: usize) -> i64 {
        set_precise_timer_slack();
        if self.leads {
            let pinned = self.cpus.get(thread).map(|&cpu| pin_to(&[cpu]));
            let cpu_ns = self.leader_or_follower(thread);
            if pinned.is_some() {
                unpin_to(None); // its id may be another thread's next
            }
            return cpu_ns;
        }
        let batch = if self.mode == Mode::Afap { AFAP_BATCH } else { 1 };
        let (mut cur, mut count, mut reported) = (None, 0u64, 0u64);
        while let Some((slot, first, end)) = self.claim(&mut cur, batch) {
            let done = self.issue_rows(&slot, first..end, thread);
            count += done as u64;
            // The chunk's counters are shared by every thread: touched once per claim, not per
            // I/O, or their cache line would cross between the CPUs with every I/O.
            slot.finished.fetch_add(done, Ordering::Release);
            if count - reported >= PROGRESS_EVERY {
                self.completed.fetch_add(count - reported, Ordering::Relaxed);
                reported = count;
            }
            if done < end - first {
                break; // stopped: the rows left stay unissued (-1), and the run returns them so
            }
        }
        self.completed.fetch_add(count - reported, Ordering::Relaxed);
        self.rows_issued.fetch_add(count, Ordering::Relaxed);
        self.clock.thread_done();
        self.live.fetch_sub(1, Ordering::Release);
        thread_cpu_ns()
    }

    /// Open loop on a thread per CPU. A thread leads (one of at most `spinners`) or follows.
    /// A leader claims the next row, sleeps towards its deadline and spins the last
    /// LONG_SPIN_NS (`lead_until`), makes the system call and claims the next row, as the floor's one thread does: the
    /// rows go to threads that spin, on a CPU they hold. It stays the leader through its I/O,
    /// so the follower leads only while a leader is held (`follow`), and the follower steps
    /// down again after each row it led while the leaders were all leading. A leader that stepped down for each
    /// system call (so that the follower could lead meanwhile) handed the lead back and forth:
    /// the thread leading next had just woken from a short sleep and the other went to sleep,
    /// so both CPUs idled and woke by turns. When every idle thread claimed the next row, the
    /// one that could not spin slept to its deadline and needed the other CPU just then: of the
    /// 188 I/Os over 100 us late in 3 s at 100k IOPS on zram (sched_switch traced, a quiet
    /// minute; the floor had none), 79 went to a thread off its CPU at the deadline: 49 woken
    /// but waiting for a CPU (the results' Parquet encoder, the Python thread, other
    /// processes), 26 woken late from the sleep itself (up to 1.4 ms, both CPUs idle), 4
    /// preempted. Each thread keeps to a CPU of its own (`cpus_in_turn`): on the same CPU, the
    /// follower's look every FOLLOW_NS preempted the leader for ~10-30 us, which made 928 of the
    /// 2,260 I/Os 10-100 us late in 3 s at 20k IOPS (traced; p99 27 us, 5.9 us kept apart).
    /// Returns the thread's CPU time.
    fn leader_or_follower(&self, thread: usize) -> i64 {
        let (mut cur, mut count, mut reported) = (None, 0u64, 0u64);
        let step_down = || {
            self.leading[thread].0.store(i64::MAX, Ordering::Relaxed);
            self.spinning.fetch_sub(1, Ordering::Release);
        };
        // Threads 0 to spinners - 1 lead first, the last follows (`tend` keeps to its CPU).
        let mut at_once = thread < self.spinners;
        'lead: while self.follow(&mut cur, std::mem::replace(&mut at_once, true)) {
            loop {
                let Some((slot, i, _)) = self.claim(&mut cur, 1) else {
                    step_down();
                    break 'lead;
                };
                let io = slot.chunk.io_reading_into(i, self.bufs, thread as u64);
                let due = self.due(&slot, i);
                self.leading[thread].0.store(self.t0 + due, Ordering::Relaxed);
                let Some(at) = self.lead_until(self.t0 + due) else {
                    step_down();
                    break 'lead; // stopped: the row stays unissued (-1), and the run returns it so
                };
                self.record(&slot, i, due, at, self.issuer.issue(&io, at, thread));
                count += 1;
                slot.finished.fetch_add(1, Ordering::Release);
                if count - reported >= PROGRESS_EVERY {
                    self.completed.fetch_add(count - reported, Ordering::Relaxed);
                    reported = count;
                }
                if thread >= self.spinners && self.spinning.load(Ordering::Acquire) > self.spinners {
                    break; // the follower stood in for a leader held up: it steps down again
                }
            }
            step_down();
        }
        self.completed.fetch_add(count - reported, Ordering::Relaxed);
        self.rows_issued.fetch_add(count, Ordering::Relaxed);
        self.clock.thread_done();
        self.live.fetch_sub(1, Ordering::Release);
        thread_cpu_ns()
    }

    /// Waits, off the CPU, until this thread can lead; false on a stop. A thread that starts
    /// (or has stepped down) leads if a place is free; else it follows: a place is free when
    /// fewer than `spinners` lead (at the start, or after a leader stepped down), and the
    /// follower takes it only when the next row is due within FOLLOW_NS, looking again
    /// FOLLOW_NS later, or FOLLOW_NS before a later row's deadline (with every row pushed
    /// claimed, at the leaders' first). With no row left to claim it takes a free place too:
    /// the claim then waits for the next chunk, or ends the thread at the end of the input.
    /// When a leader's row is over FOLLOW_NS late, that leader is held up (off its CPU, or in
    /// a long I/O): the follower leads as well, so the rows after it go on time.
    fn follow(&self, cur: &mut Option<Arc<Slot>>, at_once: bool) -> bool {
        let lead = |n: usize| (n < self.spinners).then_some(n + 1);
        if at_once && self.spinning.fetch_update(Ordering::Acquire, Ordering::Relaxed, lead).is_ok() {
            return true; // a stop is seen by the claim or the wait
        }
        loop {
            if self.stopping() {
                return false;
            }
            let now = self.clock.now();
            let next = self.next_due(cur);
            let near = next.is_none_or(|t| t - now <= FOLLOW_NS);
            if near && self.spinning.fetch_update(Ordering::Acquire, Ordering::Relaxed, lead).is_ok() {
                return true;
            }
            let held = || self.leading.iter().any(|l| now - l.0.load(Ordering::Relaxed) > FOLLOW_NS);
            let until = match next {
                Some(t) if t - now > FOLLOW_NS => (t - FOLLOW_NS).min(now + MAX_BLOCK_NS),
                _ if held() => {
                    self.spinning.fetch_add(1, Ordering::Acquire); // beyond `spinners`: one is held
                    return true;
                }
                Some(_) => now + FOLLOW_NS,
                // Rows pushed later are due no earlier than the leaders' (trace order).
                None => match self.leading.iter().map(|l| l.0.load(Ordering::Relaxed)).min() {
                    Some(t) if t < i64::MAX => t.clamp(now + FOLLOW_NS, now + MAX_BLOCK_NS),
                    _ => now + IDLE_FOLLOW_NS,
                },
            };
            self.clock.sleep_until(until);
        }
    }

    /// The deadline of the next row to claim, from `cur` or the newest chunk; None when every
    /// row pushed so far is claimed.
    fn next_due(&self, cur: &mut Option<Arc<Slot>>) -> Option<i64> {
        let unclaimed = |s: &Slot| {
            let i = s.claimed.load(Ordering::Relaxed);
            (i < s.chunk.len()).then(|| self.t0 + self.due(s, i))
        };
        if let Some(n) = cur.as_deref().and_then(unclaimed) {
            return Some(n);
        }
        let back = Arc::clone(lock(&self.feed).active.back()?);
        let n = unclaimed(&back);
        *cur = Some(back);
        n
    }

    /// Row `i`'s intended time (open loop: AFAP has no leaders).
    fn due(&self, slot: &Slot, i: usize) -> i64 {
        match self.mode {
            Mode::Original { speed } | Mode::Causal { speed, .. } => intended_ns(slot.chunk.ts_ns[i], speed),
            Mode::Afap => unreachable!("AFAP has no deadlines"),
        }
    }

    /// A leader's wait for deadline `t`: sleep until LONG_SPIN_NS before it and spin the rest,
    /// so that its CPU does not idle while its row is near (`LONG_SPIN_NS`); or, with the
    /// process's `LongSpin` place taken (by another leader, or a replay side by side), sleep
    /// until SPIN_NS before it. The time last read (>= t), or None on a stop.
    fn lead_until(&self, t: i64) -> Option<i64> {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            let now = self.clock.now();
            if t - now <= SPIN_NS {
                return Some(self.clock.spin_until(t));
            }
            if t - now <= LONG_SPIN_NS {
                if let Some(_place) = self.clock.long_spin() {
                    return Some(self.clock.spin_until(t));
                }
                self.clock.sleep_until(t - SPIN_NS);
                continue;
            }
            self.clock.sleep_until(now + (t - now - LONG_SPIN_NS).min(MAX_BLOCK_NS));
        }
    }

    fn record(&self, slot: &Slot, i: usize, due: i64, at: i64, c: Completion) {
        slot.intended_ns[i].store(due, Ordering::Relaxed);
        slot.issue_ns[i].store(c.issue_ns.unwrap_or(at) - self.t0, Ordering::Relaxed);
        slot.complete_ns[i].store(c.complete_ns - self.t0, Ordering::Relaxed);
        slot.result[i].store(slot.chunk.result(i, c.result), Ordering::Relaxed);
    }

    /// Waits for, issues and records the claimed `rows` of `slot` in order; returns how many
    /// it did (fewer on a stop).
    fn issue_rows(&self, slot: &Slot, rows: Range<usize>, thread: usize) -> usize {
        let (first, rows_end) = (rows.start, rows.end);
        // AFAP: when this thread's previous I/O completed, the clock read that timed it.
        let mut last = None;
        for i in rows {
            if self.stopping() {
                return i - first;
            }
            // Built before the wait, so nothing but the system call follows the deadline.
            let io = slot.chunk.io_reading_into(i, self.bufs, thread as u64);
            let (due, at) = match self.mode {
                Mode::Original { speed } | Mode::Causal { speed, .. } => {
                    let due = intended_ns(slot.chunk.ts_ns[i], speed);
                    match self.wait_for(self.t0 + due) {
                        Some(at) => (due, at),
                        None => return i - first,
                    }
                }
                Mode::Afap => {
                    // The previous completion's clock read stands for this I/O's issue time:
                    // only the previous row's four stores and this row's description lie
                    // between them (~10-20 ns, below one clock read's 21-27 ns here). Two
                    // clock reads per I/O were 3 % of the pool threads' CPU on zram (perf).
                    let at = last.unwrap_or_else(|| self.clock.now());
                    (at - self.t0, at)
                }
            };
            let c = self.issuer.issue(&io, at, thread);
            last = Some(c.complete_ns);
            self.record(slot, i, due, at, c);
        }
        rows_end - first
    }
}

/// Replays with `size.threads` threads issuing through `issuer` (at most `depth` of them: each
/// has one I/O in flight; at most `size.spinners` spin at once), in open loop or AFAP (not
/// causal: run.rs), with `run`'s contract: chunks in, results out in order, partial chunks
/// marked on a stop. The summary's CPU time is the threads' together.
#[allow(clippy::too_many_arguments)]
pub fn run_pool<C: Clock, I: Issuer>(
    issuer: &I,
    size: PoolSize,
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
    assert!(!matches!(mode, Mode::Causal { .. }), "causal timing runs in run.rs");
    // Open loop: the threads start before the start instant and wait for their rows'
    // deadlines themselves; started at it, the first rows went out late by the threads' start
    // (0.2-0.8 ms at 20k IOPS on zram: the first 5-20 rows over 100 us late). AFAP has no
    // deadlines, so its threads start at the start instant.
    let (first, t0) = match first_chunk(&input, start, stop, clock) {
        Ok(begun) => begun,
        Err(summary) => return Ok(summary),
    };
    if mode == Mode::Afap && wait_or_stop(clock, t0, stop).is_none() {
        let _ = output.send(Slot::new(first).result());
        return Ok(stopped(t0));
    }
    let (threads, spinners) = (size.threads.clamp(1, depth.max(1)), size.spinners.max(1));
    // Leaders and one follower at most: with a thread per I/O in flight (a driver that queues
    // I/Os), the many threads that cannot lead would all look for a free place.
    let leads = mode != Mode::Afap && threads <= spinners + 1;
    let pool = Pool {
        feed: Mutex::new(Feed { input, input_open: true, active: VecDeque::from([Slot::new(first)]), ready: None, output }),
        issuer,
        bufs,
        clock,
        mode,
        t0,
        stop,
        deaf: AtomicBool::new(false),
        completed,
        rows_issued: AtomicU64::new(0),
        spinning: AtomicUsize::new(0),
        spinners,
        leads,
        leading: (0..if leads { threads } else { 0 }).map(|_| Leading(AtomicI64::new(i64::MAX))).collect(),
        live: AtomicUsize::new(threads),
        cpus: if leads { cpus_in_turn(threads) } else { Vec::new() },
    };
    for _ in 0..threads {
        clock.thread_started(); // each thread says `thread_done` as it ends
    }
    // The threads inherit this thread's signal mask: the engine thread blocks the signals
    // Python handles (clock::spawn_without_signals).
    let cpu: io::Result<i64> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(threads);
        for k in 0..threads {
            let pool = &pool;
            let spawned = std::thread::Builder::new().name(format!("psync-{k}")).spawn_scoped(s, move || pool.worker(k));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    pool.deaf.store(true, Ordering::Relaxed); // the started ones end at once
                    return Err(e);
                }
            }
        }
        // This thread tends on the follower's CPU, off the leaders': gathering a chunk's
        // results there held a leader up to 1 ms (13 of the 19 I/Os over 100 us late in 3 s at
        // 50k IOPS, traced). Its own CPUs are given back after.
        let own = allowed_cpus();
        let off_leaders = pool.cpus.get(spinners..).filter(|c| !c.is_empty());
        if let Some(cpus) = off_leaders {
            pin_to(cpus);
        }
        let keep_off = (issuer.keeps_others_off() && !pool.cpus.is_empty()).then(|| KeepOff::new(&pool.cpus[..spinners.min(pool.cpus.len())]));
        pool.tend();
        drop(keep_off);
        if off_leaders.is_some() {
            unpin_to(Some(&own));
        }
        Ok(handles.into_iter().map(|h| h.join().expect("a psync thread panicked")).sum())
    });
    let cpu = cpu?;
    // What remains (stopped: partially issued) goes out in order, the chunk laid out ahead
    // unissued.
    let feed = pool.feed.into_inner().unwrap_or_else(|e| e.into_inner());
    for s in feed.active.into_iter().chain(feed.ready) {
        let _ = feed.output.send(s.result());
    }
    let interrupted = stop.load(Ordering::Relaxed) || pool.deaf.load(Ordering::Relaxed);
    Ok(Summary { start_ns: t0, rows_issued: pool.rows_issued.into_inner(), interrupted, cpu_ns: cpu + thread_cpu_ns() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::OP_READ;
    use crate::clock::{now_ns, Counting, LongSpin, Monotonic};
    use crate::data::DataPattern;
    use crate::run::START_UNSET;
    use std::collections::HashMap;
    use std::sync::mpsc::{channel, sync_channel};
    use std::sync::Condvar;
    use std::thread::ThreadId;

    /// Virtual time for the pool's threads: it stands still while any of them runs and jumps
    /// to the earliest deadline asked for once all of them wait, so a run's schedule does not
    /// depend on how the host schedules the threads. Records every wait, by thread.
    #[derive(Default)]
    struct VirtualClock {
        state: Mutex<VState>,
        moved: Condvar,
        waits: Mutex<Vec<(ThreadId, i64)>>,
        /// The spins (with time left to spin), by thread and deadline.
        spun: Mutex<Vec<(ThreadId, i64)>>,
        /// A spin towards one of these deadlines ends this much later: its thread was off its
        /// CPU meanwhile.
        held: HashMap<i64, i64>,
        /// No wait reaches past this (0: no end): a thread that would wait for ever fails.
        end: i64,
        /// The sleeps, by thread and the time they were to end.
        slept: Mutex<Vec<(ThreadId, i64)>>,
        /// The time on this clock as each pool thread started.
        started: Mutex<Vec<i64>>,
        /// The `LongSpin` place is never free (another replay holds it).
        no_long_spin: bool,
    }

    #[derive(Default)]
    struct VState {
        now: i64,
        registered: usize,
        running: usize,
        waiting: Vec<i64>,
        /// Threads in `spin_until` now, the most at once, and the spins in all.
        spinning: usize,
        most_spinning: usize,
        spins: usize,
    }

    impl VirtualClock {
        fn at(t: i64) -> Self {
            let c = Self::default();
            c.state.lock().unwrap().now = t;
            c
        }

        /// With every thread waiting, move to the earliest deadline and release its waiters
        /// (counted as running from now on, so nobody moves the clock past them meanwhile).
        fn advance(&self, st: &mut VState) {
            if st.running == 0 && !st.waiting.is_empty() {
                st.now = st.now.max(*st.waiting.iter().min().unwrap());
                let now = st.now;
                let before = st.waiting.len();
                st.waiting.retain(|&t| t > now);
                st.running += before - st.waiting.len();
                self.moved.notify_all();
            }
        }
    }

    impl VirtualClock {
        /// Waits (in virtual time) until `t`, recording the wait.
        fn wait(&self, t: i64) -> i64 {
            assert!(self.end == 0 || t <= self.end, "a thread waits past the run's end");
            self.waits.lock().unwrap().push((std::thread::current().id(), t));
            let mut st = self.state.lock().unwrap();
            if st.now >= t {
                return st.now;
            }
            if st.registered == 0 {
                st.now = t; // the run's own thread, before the pool's start
                return t;
            }
            st.running -= 1;
            st.waiting.push(t);
            self.advance(&mut st);
            while st.now < t {
                st = self.moved.wait(st).unwrap();
            }
            st.now
        }
    }

    impl Clock for VirtualClock {
        fn now(&self) -> i64 {
            self.state.lock().unwrap().now
        }
        fn sleep_until(&self, t: i64) -> i64 {
            self.slept.lock().unwrap().push((std::thread::current().id(), t));
            self.wait(t)
        }
        /// Counts the threads spinning at once (those with time left to spin).
        fn spin_until(&self, t: i64) -> i64 {
            let spins = {
                let mut st = self.state.lock().unwrap();
                let spins = st.now < t;
                if spins {
                    st.spinning += 1;
                    st.most_spinning = st.most_spinning.max(st.spinning);
                    st.spins += 1;
                    self.spun.lock().unwrap().push((std::thread::current().id(), t));
                }
                spins
            };
            let at = self.wait(t + self.held.get(&t).copied().unwrap_or(0));
            if spins {
                self.state.lock().unwrap().spinning -= 1;
            }
            at
        }
        fn long_spin(&self) -> Option<LongSpin> {
            (!self.no_long_spin).then(LongSpin::free)
        }
        fn thread_started(&self) {
            let mut st = self.state.lock().unwrap();
            self.started.lock().unwrap().push(st.now);
            st.registered += 1;
            st.running += 1;
        }
        fn thread_done(&self) {
            let mut st = self.state.lock().unwrap();
            st.registered -= 1;
            st.running -= 1;
            self.advance(&mut st);
        }
    }

    /// Issues nothing: records which thread issued each row and when, and holds the thread
    /// (in virtual time) for `stalls[row]`.
    struct Recorder<'a> {
        clock: &'a VirtualClock,
        stalls: HashMap<u64, i64>,
        issued: Mutex<HashMap<u64, (ThreadId, i64)>>,
    }

    impl Issuer for Recorder<'_> {
        fn issue(&self, io: &Io, at: i64, _thread: usize) -> Completion {
            self.issued.lock().unwrap().insert(io.token, (std::thread::current().id(), at));
            if let Some(&stall) = self.stalls.get(&io.token) {
                self.clock.wait_until(at + stall);
            }
            Completion { token: io.token, result: io.bytes(), issue_ns: Some(at), complete_ns: self.clock.now() }
        }
    }

    fn chunks(ts: &[i64], step: usize) -> Vec<Chunk> {
        ts.chunks(step)
            .enumerate()
            .map(|(k, part)| {
                let n = part.len();
                Chunk::new((k * step) as u64, part.to_vec(), vec![OP_READ; n], vec![0; n], vec![4096; n], None, 4096).unwrap()
            })
            .collect()
    }

    /// Replays `ts` (chunks of `step` rows) on `threads` threads; returns the results in
    /// order and the summary.
    fn replay<C: Clock, I: Issuer>(issuer: &I, clock: &C, threads: usize, mode: Mode, ts: &[i64], step: usize, start: i64) -> (Vec<ChunkResult>, Summary) {
        replay_sized(issuer, clock, PoolSize { threads, spinners: threads }, mode, ts, step, start)
    }

    fn replay_sized<C: Clock, I: Issuer>(issuer: &I, clock: &C, size: PoolSize, mode: Mode, ts: &[i64], step: usize, start: i64) -> (Vec<ChunkResult>, Summary) {
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let cs = chunks(ts, step);
        let (tx, rx) = sync_channel(cs.len().max(1));
        for c in cs {
            tx.send(c).unwrap();
        }
        drop(tx);
        let (otx, orx) = channel();
        let start = AtomicI64::new(start);
        let summary = run_pool(issuer, size, &bufs, mode, 1024, &start, rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), clock).unwrap();
        (orx.into_iter().collect(), summary)
    }

    fn column(out: &[ChunkResult], f: fn(&ChunkResult) -> &Vec<i64>) -> Vec<i64> {
        out.iter().flat_map(|r| f(r).clone()).collect()
    }

    #[test]
    fn each_io_is_issued_by_the_thread_that_waited_for_its_deadline() {
        // Irregular gaps, from 0 to 300 us: rows bunch up and spread out.
        let ts: Vec<i64> = (0..400i64).scan(0, |t, i| {
            *t += (i * 7919 % 31) * 10_000 + 1;
            Some(*t)
        }).collect();
        let t0 = 1_000_000_000;
        let clock = VirtualClock::at(t0);
        let rec = Recorder { clock: &clock, stalls: HashMap::from([(5, 400_000), (77, 2_000_000)]), issued: Mutex::default() };
        let (out, summary) = replay(&rec, &clock, 3, Mode::Original { speed: 1.0 }, &ts, 64, t0);
        assert_eq!(summary.rows_issued, 400);
        let issued = rec.issued.lock().unwrap();
        let waits = clock.waits.lock().unwrap();
        let (intended, issue) = (column(&out, |r| &r.intended_ns), column(&out, |r| &r.issue_ns));
        for (i, &t) in ts.iter().enumerate() {
            let (thread, at) = issued[&(i as u64)];
            assert_eq!(intended[i], t);
            assert_eq!(issue[i], at - t0);
            assert!(waits.contains(&(thread, t0 + t)), "row {i}: issued by a thread that did not wait for it");
        }
    }

    #[test]
    fn a_late_thread_does_not_delay_independent_later_ios() {
        // A row every 100 us; row 10 holds its thread for 5 ms.
        let ts: Vec<i64> = (0..200).map(|i| i * 100_000).collect();
        let stalls = HashMap::from([(10u64, 5_000_000i64)]);
        let run = |threads| {
            let clock = VirtualClock::at(0);
            let rec = Recorder { clock: &clock, stalls: stalls.clone(), issued: Mutex::default() };
            let (out, _) = replay(&rec, &clock, threads, Mode::Original { speed: 1.0 }, &ts, 50, 0);
            column(&out, |r| &r.issue_ns)
        };
        // Two threads: the other one takes every row while the first is held.
        assert_eq!(run(2), ts);
        // One thread (the test's premise): the rows due during the stall go late.
        let one = run(1);
        assert_eq!(one[11], 10 * 100_000 + 5_000_000);
        assert!((11..60).all(|i| one[i] > ts[i]));
    }

    #[test]
    fn no_more_threads_spin_at_once_than_allowed_and_rows_stay_on_time() {
        // A row every 15 us: with three threads, all three are within SPIN_NS of a deadline.
        let ts: Vec<i64> = (0..300).map(|i| i * 15_000).collect();
        let run = |spinners| {
            let clock = VirtualClock::at(0);
            let rec = Recorder { clock: &clock, stalls: HashMap::new(), issued: Mutex::default() };
            let (out, _) = replay_sized(&rec, &clock, PoolSize { threads: 3, spinners }, Mode::Original { speed: 1.0 }, &ts, 100, 0);
            let st = clock.state.lock().unwrap();
            (column(&out, |r| &r.issue_ns), st.most_spinning, st.spins)
        };
        let (issue, most, spins) = run(1);
        assert_eq!(issue, ts, "a thread that did not spin issued off its deadline");
        assert_eq!(most, 1);
        assert!(spins < ts.len(), "every row was spun for: no thread ever followed");
        // The premise: let every thread spin, and they do spin together.
        let (issue, most, _) = run(3);
        assert_eq!(issue, ts);
        assert!(most > 1);
    }

    /// Completes every I/O at once, its completion timed on `clock`.
    struct Timed<'a>(&'a Counting);

    impl Issuer for Timed<'_> {
        fn issue(&self, io: &Io, at: i64, _thread: usize) -> Completion {
            Completion { token: io.token, result: io.bytes(), issue_ns: Some(at), complete_ns: self.0.now() }
        }
    }

    #[test]
    fn afap_reads_the_clock_once_per_io() {
        // Each I/O's completion time is the issue time of its thread's next one in the batch.
        let n = 10_000;
        let clock = Counting::default();
        let (out, summary) = replay(&Timed(&clock), &clock, 2, Mode::Afap, &vec![0; n], 1000, START_UNSET);
        assert_eq!(summary.rows_issued, n as u64);
        let reads = clock.reads() as usize;
        // One per I/O, one per batch claimed, and the start's few.
        assert!(reads <= n + n / AFAP_BATCH + 2 * 10 + 10, "{reads} clock reads for {n} I/Os");
        let (issue, complete) = (column(&out, |r| &r.issue_ns), column(&out, |r| &r.complete_ns));
        assert!((0..n).all(|i| issue[i] >= 0 && complete[i] >= issue[i]));
        let follows = (1..n).filter(|&i| issue[i] == complete[i - 1]).count();
        assert!(follows > n / 4, "only {follows} I/Os went out at the previous one's completion");
    }

    #[test]
    fn with_a_thread_per_cpu_each_row_goes_to_a_thread_that_spins_for_it() {
        // A row every 15 us, I/Os done at once, two threads of which one may spin: the leader
        // is free for every next row, so no row is left to a thread that sleeps to it.
        let ts: Vec<i64> = (0..300).map(|i| i * 15_000).collect();
        let clock = VirtualClock { end: 10_000_000, ..VirtualClock::default() };
        let rec = Recorder { clock: &clock, stalls: HashMap::new(), issued: Mutex::default() };
        let (out, summary) = replay_sized(&rec, &clock, PoolSize { threads: 2, spinners: 1 }, Mode::Original { speed: 1.0 }, &ts, 64, 0);
        assert_eq!(summary.rows_issued, 300);
        assert_eq!(column(&out, |r| &r.issue_ns), ts);
        let (issued, spun) = (rec.issued.lock().unwrap(), clock.spun.lock().unwrap());
        for (i, &t) in ts.iter().enumerate().skip(1) {
            assert!(spun.contains(&(issued[&(i as u64)].0, t)), "row {i}: issued by a thread that did not spin for it");
        }
        assert_eq!(clock.state.lock().unwrap().most_spinning, 1);
    }

    #[test]
    fn a_leader_held_off_its_cpu_does_not_delay_the_rows_after_it() {
        // A row every 100 us; the thread spinning for row 10 is off its CPU for 5 ms.
        let ts: Vec<i64> = (0..200).map(|i| i * 100_000).collect();
        let run = |threads| {
            let clock = VirtualClock { held: HashMap::from([(ts[10], 5_000_000)]), end: 100_000_000, ..VirtualClock::default() };
            let rec = Recorder { clock: &clock, stalls: HashMap::new(), issued: Mutex::default() };
            let (out, _) = replay_sized(&rec, &clock, PoolSize { threads, spinners: 1 }, Mode::Original { speed: 1.0 }, &ts, 50, 0);
            column(&out, |r| &r.issue_ns)
        };
        // The follower leads as well while the leader is held.
        let two = run(2);
        assert_eq!(two[10], ts[10] + 5_000_000);
        assert_eq!((two[..10].to_vec(), two[11..].to_vec()), (ts[..10].to_vec(), ts[11..].to_vec()));
        // One thread (the test's premise): the rows due meanwhile go late.
        let one = run(1);
        assert!((11..60).all(|i| one[i] > ts[i]));
    }

    #[test]
    fn the_threads_start_before_the_start_and_the_first_row_goes_out_on_it() {
        // Started at the start instant, the threads' own start made the first rows late.
        let ts: Vec<i64> = (0..50).map(|i| i * 15_000).collect();
        let start = 5_000_000;
        let clock = VirtualClock { end: 100_000_000, ..VirtualClock::default() };
        let rec = Recorder { clock: &clock, stalls: HashMap::new(), issued: Mutex::default() };
        let (out, summary) = replay_sized(&rec, &clock, PoolSize { threads: 2, spinners: 1 }, Mode::Original { speed: 1.0 }, &ts, 16, start);
        assert_eq!((summary.start_ns, summary.rows_issued), (start, 50));
        assert_eq!(column(&out, |r| &r.issue_ns), ts);
        let started = clock.started.lock().unwrap();
        assert_eq!(started.len(), 2);
        assert!(started.iter().all(|&t| t < start), "threads started at {started:?}, the run at {start}");
    }

    #[test]
    fn a_leader_keeps_the_lead_through_its_io() {
        // A row every 15 us, each I/O 8 us long: the leader is in an I/O half the time. It stays
        // the leader meanwhile, so the follower, never finding a leader held, issues nothing.
        let ts: Vec<i64> = (0..300).map(|i| i * 15_000).collect();
        let clock = VirtualClock { end: 10_000_000, ..VirtualClock::default() };
        let stalls = (0..300u64).map(|i| (i, 8_000)).collect();
        let rec = Recorder { clock: &clock, stalls, issued: Mutex::default() };
        let (out, _) = replay_sized(&rec, &clock, PoolSize { threads: 2, spinners: 1 }, Mode::Original { speed: 1.0 }, &ts, 64, 0);
        assert_eq!(column(&out, |r| &r.issue_ns), ts);
        let issued = rec.issued.lock().unwrap();
        let leader = issued[&0].0;
        let others = (0..300u64).filter(|i| issued[i].0 != leader).count();
        assert_eq!(others, 0, "{others} rows went to the follower with no leader held");
    }

    #[test]
    fn a_leader_sleeps_only_towards_a_deadline_more_than_long_spin_ns_away() {
        // Rows 300 us apart, then a 50 ms gap: the leader spins through the short gaps (a sleep
        // lets its CPU idle, and the idle CPU's wake-up is late now and then by up to
        // milliseconds on a VM) and sleeps through the long one until LONG_SPIN_NS before its
        // row. With the LongSpin place taken, it sleeps until SPIN_NS before each row instead.
        let mut ts: Vec<i64> = (0..20).map(|i| i * 300_000).collect();
        ts.push(ts[19] + 50_000_000);
        for no_long_spin in [false, true] {
            let clock = VirtualClock { end: 200_000_000, no_long_spin, ..VirtualClock::default() };
            let rec = Recorder { clock: &clock, stalls: HashMap::new(), issued: Mutex::default() };
            let (out, _) = replay_sized(&rec, &clock, PoolSize { threads: 2, spinners: 1 }, Mode::Original { speed: 1.0 }, &ts, 64, 0);
            assert_eq!(column(&out, |r| &r.issue_ns), ts);
            let leader = rec.issued.lock().unwrap()[&0].0;
            let slept: Vec<i64> = clock.slept.lock().unwrap().iter().filter(|s| s.0 == leader).map(|s| s.1).collect();
            let expected = if no_long_spin {
                ts[1..].iter().map(|t| t - SPIN_NS).chain([ts[20] - LONG_SPIN_NS]).collect::<std::collections::BTreeSet<_>>()
            } else {
                [ts[20] - LONG_SPIN_NS].into()
            };
            assert_eq!(slept.iter().copied().collect::<std::collections::BTreeSet<_>>(), expected, "the leader's sleeps (no place free: {no_long_spin})");
        }
    }

    /// Issues nothing; records the CPUs each issuing thread may run on, by thread index, and
    /// those of the run's own thread (`tid`); holds the thread that issues row 10 for 5 ms
    /// (real time) so that the follower leads as well.
    struct Affinity {
        tid: libc::pid_t,
        threads: Mutex<HashMap<usize, Vec<usize>>>,
        run: Mutex<Vec<Vec<usize>>>,
    }

    impl Issuer for Affinity {
        fn issue(&self, io: &Io, at: i64, thread: usize) -> Completion {
            self.threads.lock().unwrap().entry(thread).or_insert_with(allowed_cpus);
            self.run.lock().unwrap().push(cpus_of(self.tid));
            if io.token == 10 {
                std::thread::sleep(Duration::from_millis(5));
            }
            Completion { token: io.token, result: io.bytes(), issue_ns: Some(at), complete_ns: now_ns() }
        }
    }

    #[test]
    fn leaders_follower_and_the_runs_own_thread_keep_to_cpus_of_their_own() {
        let _cpus = lock(&CPUS); // another test's KeepOff would change the run's own thread's CPUs
        // A row every 50 us for 50 ms; row 10 holds its thread 5 ms, so both threads issue.
        let ts: Vec<i64> = (0..1000).map(|i| i * 50_000).collect();
        // SAFETY: gettid has no preconditions.
        let rec = Affinity { tid: unsafe { libc::gettid() }, threads: Mutex::default(), run: Mutex::default() };
        let before = allowed_cpus();
        let (_, summary) = replay_sized(&rec, &Monotonic, PoolSize { threads: 2, spinners: 1 }, Mode::Original { speed: 1.0 }, &ts, 500, START_UNSET);
        assert_eq!(summary.rows_issued, 1000);
        assert_eq!(allowed_cpus(), before, "the run's own thread did not get its CPUs back");
        let seen = rec.threads.lock().unwrap();
        assert_eq!(seen.len(), 2, "both threads issue");
        if before.len() >= 2 {
            assert!(seen.values().all(|c| c.len() == 1), "a thread may run on more than one CPU: {seen:?}");
            assert_ne!(seen[&0], seen[&1], "both threads on one CPU");
            // Row 500 on, the run's own thread tends, on the follower's CPU only.
            let run = rec.run.lock().unwrap();
            assert!(run[500..].iter().all(|c| !c.contains(&seen[&0][0])), "the run's own thread may run on the leader's CPU");
        }
    }

    /// Serialises the tests that change or look at the CPUs of the test process's threads.
    static CPUS: Mutex<()> = Mutex::new(());

    /// Issues nothing, as `Psync` keeping the process's other threads off the leaders' CPUs;
    /// records the CPUs each issuing thread may run on, by thread index, and at row 500 those of
    /// a thread of the test's (`other`) and of a thread it starts then.
    struct KeepingOff {
        other: libc::pid_t,
        start: Mutex<Sender<()>>,
        started: Mutex<Receiver<libc::pid_t>>,
        threads: Mutex<HashMap<usize, Vec<usize>>>,
        during: Mutex<Vec<(libc::pid_t, Vec<usize>)>>,
    }

    impl Issuer for KeepingOff {
        fn issue(&self, io: &Io, at: i64, thread: usize) -> Completion {
            self.threads.lock().unwrap().entry(thread).or_insert_with(allowed_cpus);
            if io.token == 500 {
                self.start.lock().unwrap().send(()).unwrap();
                let new = self.started.lock().unwrap().recv().unwrap();
                *self.during.lock().unwrap() = vec![(self.other, cpus_of(self.other)), (new, cpus_of(new))];
            }
            Completion { token: io.token, result: io.bytes(), issue_ns: Some(at), complete_ns: now_ns() }
        }

        fn keeps_others_off(&self) -> bool {
            true
        }
    }

    #[test]
    fn the_processs_other_threads_keep_off_the_leaders_cpus_while_the_open_loop_runs() {
        // A row every 50 us for 50 ms. A thread of the test's, started before, and one it
        // starts at row 500 may not run on the leader's CPU meanwhile, and have all their CPUs
        // back after.
        let _cpus = lock(&CPUS);
        let ts: Vec<i64> = (0..1000).map(|i| i * 50_000).collect();
        let (start_tx, start_rx) = channel::<()>();
        let (started_tx, started_rx) = channel();
        let (end_tx, end_rx) = channel::<()>();
        let (tid_tx, tid_rx) = channel();
        // The test's thread: starts another on request, both wait for the end.
        let other = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            if start_rx.recv().is_ok() {
                let (tx, rx) = channel();
                let child = std::thread::spawn(move || {
                    // SAFETY: as above.
                    tx.send(unsafe { libc::gettid() }).unwrap();
                    let _ = end_rx.recv();
                });
                started_tx.send(rx.recv().unwrap()).unwrap();
                child.join().unwrap();
            }
        });
        let other_tid = tid_rx.recv().unwrap();
        let before = cpus_of(other_tid);
        let rec = KeepingOff {
            other: other_tid,
            start: Mutex::new(start_tx),
            started: Mutex::new(started_rx),
            threads: Mutex::default(),
            during: Mutex::default(),
        };
        let (_, summary) = replay_sized(&rec, &Monotonic, PoolSize { threads: 2, spinners: 1 }, Mode::Original { speed: 1.0 }, &ts, 500, START_UNSET);
        assert_eq!(summary.rows_issued, 1000);
        let during = rec.during.lock().unwrap().clone();
        let after: Vec<Vec<usize>> = during.iter().map(|(tid, _)| cpus_of(*tid)).collect();
        drop(end_tx);
        other.join().unwrap();
        assert_eq!(after, vec![before.clone(), before.clone()], "the test's threads did not get their CPUs back");
        // Thread 0 leads first; a loaded machine may keep it off its CPU for all 50 ms (the
        // follower then issues every row), which leaves nothing to check here.
        let leader = rec.threads.lock().unwrap().get(&0).cloned();
        if let (true, Some(leader)) = (before.len() >= 2, leader) {
            assert_eq!(leader.len(), 1);
            for (tid, cpus) in &during {
                assert!(!cpus.is_empty() && !cpus.contains(&leader[0]), "thread {tid} may run on the leader's CPU {leader:?}: {cpus:?}");
            }
        }
    }

    /// The chunks (by base) a pool thread took from the input itself, the run's own thread
    /// having laid out none ahead.
    pub(super) static LAID_OUT_BY_A_POOL_THREAD: Mutex<Vec<u64>> = Mutex::new(Vec::new());

    #[test]
    fn each_chunk_is_laid_out_ahead_by_the_runs_own_thread() {
        // Three chunks of 10 rows 3 ms apart, on the real clock: the run's own thread lays each
        // next one out while the pool's threads replay the one before.
        let base = 1 << 40;
        let (tx, rx) = sync_channel(3);
        for k in 0..3u64 {
            let ts = (0..10).map(|i| (k as i64 * 10 + i) * 3_000_000).collect();
            tx.send(Chunk::new(base + k * 10, ts, vec![OP_READ; 10], vec![0; 10], vec![4096; 10], None, 4096).unwrap()).unwrap();
        }
        drop(tx);
        let (otx, orx) = channel();
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let size = PoolSize { threads: 2, spinners: 1 };
        let summary = run_pool(&Instant, size, &bufs, Mode::Original { speed: 1.0 }, 8, &AtomicI64::new(START_UNSET), rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &Monotonic).unwrap();
        assert_eq!(summary.rows_issued, 30);
        let out: Vec<ChunkResult> = orx.into_iter().collect();
        assert_eq!(out.iter().map(|r| (r.base, r.issued)).collect::<Vec<_>>(), vec![(base, 10), (base + 10, 10), (base + 20, 10)]);
        let by_pool: Vec<u64> = LAID_OUT_BY_A_POOL_THREAD.lock().unwrap().iter().copied().filter(|&b| b >= base).collect();
        assert!(by_pool.is_empty(), "chunks {by_pool:?} laid out by a pool thread between two rows");
    }

    /// Completes every I/O at once, on the real clock.
    struct Instant;

    impl Issuer for Instant {
        fn issue(&self, io: &Io, at: i64, _thread: usize) -> Completion {
            Completion { token: io.token, result: io.bytes(), issue_ns: Some(at), complete_ns: now_ns() }
        }
    }

    #[test]
    fn a_long_gap_is_slept_not_spun() {
        // Two rows 2 s apart on two threads, both leading or a leader and a follower: waiting
        // for the second costs almost no CPU.
        for spinners in [2, 1] {
            let size = PoolSize { threads: 2, spinners };
            let (out, summary) = replay_sized(&Instant, &Monotonic, size, Mode::Original { speed: 1.0 }, &[0, 2_000_000_000], 2, START_UNSET);
            assert_eq!(out[0].issued, 2);
            assert!(out[0].issue_ns[1] >= 2_000_000_000);
            assert!(summary.cpu_ns < 200_000_000, "{} ms of CPU over a 2 s gap", summary.cpu_ns / 1_000_000);
        }
    }

    #[test]
    fn a_stop_is_seen_while_waiting_for_a_start_an_hour_ahead() {
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let (tx, rx) = sync_channel(1);
        tx.send(chunks(&[0, 1000], 2).pop().unwrap()).unwrap();
        let (otx, orx) = channel();
        let (stop, start) = (AtomicBool::new(false), AtomicI64::new(now_ns() + 3_600_000_000_000));
        let begun = now_ns();
        let summary = std::thread::scope(|s| {
            let h = s.spawn(|| run_pool(&Instant, PoolSize { threads: 2, spinners: 1 }, &bufs, Mode::Original { speed: 1.0 }, 8, &start, rx, otx, &stop, &AtomicU64::new(0), &Monotonic));
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
            h.join().unwrap().unwrap()
        });
        drop(tx);
        assert!(now_ns() - begun < 10_000_000_000);
        assert!(summary.interrupted);
        let out: Vec<ChunkResult> = orx.into_iter().collect();
        assert_eq!((out.len(), out[0].issued, out[0].issue_ns[0]), (1, 0, -1));
    }

    #[test]
    fn afap_reads_a_file_once_per_row_in_chunk_order() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join(format!("pool-test-{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.write_all(&vec![7u8; 64 * 4096]).unwrap();
        let bufs = Buffers::new(4096, 8, DataPattern::Zeros);
        let n = 5000;
        let cs: Vec<Chunk> = (0..n)
            .step_by(700)
            .map(|b| {
                let rows = 700.min(n - b);
                let offset = (b..b + rows).map(|i| (i as i64 * 37 % 64) * 4096).collect();
                Chunk::new(b as u64, vec![0; rows], vec![OP_READ; rows], offset, vec![4096; rows], None, 4096).unwrap()
            })
            .collect();
        let (tx, rx) = sync_channel(cs.len());
        for c in cs {
            tx.send(c).unwrap();
        }
        drop(tx);
        let (otx, orx) = channel();
        let psync = Psync { fds: vec![file.as_raw_fd()], is_block: false };
        let summary = run_pool(&psync, PoolSize { threads: 3, spinners: 2 }, &bufs, Mode::Afap, 32, &AtomicI64::new(START_UNSET), rx, otx, &AtomicBool::new(false), &AtomicU64::new(0), &Monotonic).unwrap();
        let out: Vec<ChunkResult> = orx.into_iter().collect();
        assert_eq!(summary.rows_issued, n as u64);
        assert_eq!(out.iter().map(|r| r.base).collect::<Vec<_>>(), (0..n as u64).step_by(700).collect::<Vec<_>>());
        for r in &out {
            assert_eq!(r.issued, r.result.len());
            assert!(r.result.iter().all(|&x| x == 4096));
            assert!(r.issue_ns.iter().zip(&r.complete_ns).all(|(i, c)| *i >= 0 && c >= i));
        }
    }
}

//! The monotonic clock every recorded time uses, and the wait that paces open-loop replay.

use std::sync::atomic::{AtomicBool, Ordering};

/// Nanoseconds on CLOCK_MONOTONIC (the vDSO makes this ~20 ns, no syscall).
#[inline]
pub fn now_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
}

/// CPU time the calling thread has used, in nanoseconds.
pub fn thread_cpu_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
}

/// Sleep no closer than this to a deadline; spin the rest. On the project's 2-core VMs a
/// blocking wait wakes 5-50 us late and now and then far later: replaying the demo trace
/// (2k IOPS, null engine), p99 lateness was 40-58 us spinning the last 30 us and 15-18 us
/// spinning the last 100 us, for up to a fifth of a core spent spinning at that rate.
pub const SPIN_NS: i64 = 100_000;

/// How close to a deadline a thread that holds a `LongSpin` stops sleeping. A thread that
/// sleeps lets its CPU idle, and on this project's VMs an idle vCPU halts at once (cpuidle's
/// haltpoll driver, 0 ns of polling) and resumes through the hypervisor, now and then 1-1.4
/// ms late with both CPUs otherwise idle; on a busy CPU a woken thread can wait up to a 4 ms
/// tick for it. The floor (bench/floor.c) made to sleep until 100 us before each deadline had
/// 2.55 % of its I/Os over 100 us late against 0.53 % spinning all the way (Poisson 20k IOPS
/// on zram, 3 alternating rounds each, a loaded minute); sleeping until 1 ms before, 0.31 %.
/// 2 ms outlasts the idle vCPU's late resumes. The cost: a thread that waits so spins up to
/// 2 ms per gap, so a Poisson trace keeps 1 - exp(-rate x 2 ms) of a CPU busy (measured: 19 %
/// at 100 IOPS, 87 % at 1k; the floor spins all the time), and an idle gap costs 2 ms.
pub const LONG_SPIN_NS: i64 = 2_000_000;

/// Whether a thread of this process spins towards a deadline under the `LongSpin`.
static LONG_SPINNING: AtomicBool = AtomicBool::new(false);

/// The one place in this process to spin LONG_SPIN_NS towards a deadline, so that an
/// open-loop replay keeps at most one CPU spinning that long: replays side by side (workers)
/// or a pool's leaders on a machine of many CPUs would otherwise each spin one. A thread that
/// does not get it waits as before, sleeping until SPIN_NS before its deadline. Given back
/// when dropped.
pub struct LongSpin(Option<&'static AtomicBool>);

impl LongSpin {
    /// The process's place, if it is free.
    pub fn take() -> Option<Self> {
        let free = LONG_SPINNING.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
        free.then_some(Self(Some(&LONG_SPINNING)))
    }

    /// A place counted nowhere (a test clock's: its threads spin in virtual time).
    pub fn free() -> Self {
        Self(None)
    }
}

impl Drop for LongSpin {
    fn drop(&mut self) {
        if let Some(spinning) = self.0 {
            spinning.store(false, Ordering::Release);
        }
    }
}

/// Make this thread's timed sleeps precise: the default 50 us timer slack alone makes a
/// sleep ~54 us late at the median.
pub fn set_precise_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and only affects this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// The signals an engine thread or psync I/O thread never takes: the kernel delivers each to
/// a thread that does not block it, and only Python's main thread runs Python's handlers.
/// SIGINT is Ctrl-C (KeyboardInterrupt); SIGTERM and SIGHUP are the runner's to turn into a
/// clean stop (this module only keeps them away from our threads; what the run does with them
/// is Python's handlers' business); SIGALRM is the runner's time limit.
const BLOCKED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGALRM];

fn blocked_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in BLOCKED {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Start a thread with SIGINT, SIGTERM, SIGHUP and SIGALRM blocked from its first
/// instruction: the calling thread blocks them around the spawn, which the new thread
/// inherits, then restores its own mask.
pub fn spawn_without_signals<F, T>(builder: std::thread::Builder, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let set = blocked_set();
    // SAFETY: `old` is a writable sigset; pthread_sigmask only changes this thread's mask,
    // and the second call puts back exactly what the first saved.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        let spawned = builder.spawn(f);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        spawned
    }
}

/// The time source of the core loop. Production uses `Monotonic` (a zero-sized type, so the
/// generic loop compiles to direct calls); the pacing tests drive the loop with a clock they
/// advance themselves.
pub trait Clock: Sync {
    /// Now, in ns.
    fn now(&self) -> i64;
    /// Block, off the CPU, until about `t`: never before it, perhaps some microseconds after
    /// (the wake-up). Returns the time it last read.
    fn sleep_until(&self, t: i64) -> i64;
    /// Busy-wait until `t`, on the CPU; returns the time it last read, >= `t`, so a caller
    /// that issues right away can take it as its issue time (as the floor does).
    fn spin_until(&self, t: i64) -> i64;
    /// Return no earlier than `t`, on time: sleep until `SPIN_NS` before it, spin the rest.
    fn wait_until(&self, t: i64) -> i64 {
        if t - self.now() > SPIN_NS {
            self.sleep_until(t - SPIN_NS);
        }
        self.spin_until(t)
    }
    /// The place to spin LONG_SPIN_NS towards a deadline, if it is free (`LongSpin`).
    fn long_spin(&self) -> Option<LongSpin> {
        LongSpin::take()
    }
    /// A thread that waits on this clock starts and ends (a test clock that advances only when
    /// every such thread waits counts them; the real one has nothing to do).
    fn thread_started(&self) {}
    fn thread_done(&self) {}
}

/// CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug, Default)]
pub struct Monotonic;

impl Clock for Monotonic {
    #[inline]
    fn now(&self) -> i64 {
        now_ns()
    }

    fn sleep_until(&self, t: i64) -> i64 {
        loop {
            let now = now_ns();
            if now >= t {
                return now;
            }
            std::thread::sleep(std::time::Duration::from_nanos((t - now) as u64));
        }
    }

    fn spin_until(&self, t: i64) -> i64 {
        // No pause instruction in the spin: on this VM it makes each turn ~40 ns slower,
        // which doubles the median lateness against the floor's bare loop (0.021 vs 0.011 us).
        loop {
            let now = now_ns();
            if now >= t {
                return now;
            }
        }
    }
}

/// The real clock, counting its reads (tests of how often a loop reads it).
#[cfg(test)]
#[derive(Default)]
pub struct Counting(pub std::sync::atomic::AtomicU64);

#[cfg(test)]
impl Counting {
    pub fn reads(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
impl Clock for Counting {
    fn now(&self) -> i64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        now_ns()
    }
    fn sleep_until(&self, t: i64) -> i64 {
        Monotonic.sleep_until(t)
    }
    fn spin_until(&self, t: i64) -> i64 {
        Monotonic.spin_until(t)
    }
}

/// The intended issue time of an I/O, relative to the run's start: ts / speed. Computed from
/// the trace's own timestamp every time (an absolute deadline), so lateness never accumulates.
#[inline]
pub fn intended_ns(ts_ns: i64, speed: f64) -> i64 {
    if speed == 1.0 {
        ts_ns
    } else {
        (ts_ns as f64 / speed).round() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotone() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a && a > 0);
    }

    #[test]
    fn deadlines_scale_with_speed() {
        assert_eq!(intended_ns(1_000_000, 1.0), 1_000_000);
        assert_eq!(intended_ns(1_000_000, 2.0), 500_000);
        assert_eq!(intended_ns(1_000_000, 0.5), 2_000_000);
        assert_eq!(intended_ns(3, 2.0), 2); // rounds half away from zero
    }

    #[test]
    fn deadlines_are_monotone_in_trace_time() {
        for &speed in &[0.1, 0.5, 1.0, 1.5, 3.0, 1000.0] {
            let mut last = i64::MIN;
            for ts in (0..10_000_000i64).step_by(997) {
                let t = intended_ns(ts, speed);
                assert!(t >= last, "speed {speed}: {t} < {last}");
                last = t;
            }
        }
    }
}

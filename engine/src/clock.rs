//! The monotonic clock every recorded time uses, and the wait that paces open-loop replay.

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

/// Make this thread's timed sleeps precise: the default 50 us timer slack alone makes a
/// sleep ~54 us late at the median.
pub fn set_precise_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and only affects this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Keep SIGINT and SIGTERM away from engine threads, so the kernel delivers them to
/// Python's main thread, which turns them into KeyboardInterrupt and asks the engine to stop.
pub fn block_termination_signals() {
    // SAFETY: sigset operations on a local, zero-initialised set; pthread_sigmask only
    // changes the calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
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

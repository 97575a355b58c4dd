//! Causal timing: an I/O is due when the I/Os it waits for (its parents, given as rows back)
//! have completed on the target, plus its think time; an I/O that waits for nothing is due at
//! its captured time. A window of the last `WINDOW` rows is held, in preallocated rings, so a
//! trace of any length replays in bounded memory; rows become ready in any order, and a ready
//! heap ordered by due time means a row still waiting never holds back later independent ones.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Rows held at once: the rows admitted but not yet completed span at most this many. Parents
/// may be at most `WINDOW - 1` rows back (Python drops farther ones, analysis.causal.MAX_BACK).
pub const WINDOW: usize = 1 << 17;
const MASK: u64 = WINDOW as u64 - 1;
const PENDING: i64 = i64::MIN;
const NONE: u64 = u64::MAX;
/// A second parent of u32::MAX: the row (a flush) waits for every earlier row to complete.
pub const BARRIER: u32 = u32::MAX;
/// The longest think time, after scaling, that a row may have: a year. No replay waits that
/// long, and due times stay far from i64's limit (292 years); `Chunk::with_deps` refuses more.
pub const MAX_THINK_NS: i64 = 365 * 86_400 * 1_000_000_000;

/// Per-row inputs of causal timing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deps {
    /// Rows back to each parent, 0 for none.
    pub parents: [u32; 2],
    /// The application's own time between the last parent's completion and this I/O's issue.
    pub think_ns: i64,
}

/// A think time (>= 0) times the think scale (finite, >= 0), rounded, saturating at i64::MAX.
pub fn scaled_think(think_ns: i64, think_scale: f64) -> i64 {
    if think_scale == 1.0 {
        think_ns
    } else {
        // `as` saturates at i64::MAX; the clamp states it (the product may be inf).
        (think_ns as f64 * think_scale).round().min(i64::MAX as f64) as i64
    }
}

pub struct Scheduler {
    speed: f64,
    think_scale: f64,
    // Rings indexed by row % WINDOW.
    done_at: Vec<i64>,
    ready_at: Vec<i64>,
    waiting: Vec<u8>,
    think: Vec<i64>,
    first_child: Vec<u64>,
    next_child: Vec<[u64; 2]>,
    ready: BinaryHeap<Reverse<(i64, u64)>>,
    /// The next row to admit, and the lowest row not yet completed.
    admitted: u64,
    low: u64,
    /// When the rows below `low` had all completed; barrier rows waiting for that, in order.
    low_at: i64,
    barriers: VecDeque<u64>,
}

impl Scheduler {
    pub fn new(speed: f64, think_scale: f64) -> Self {
        Self {
            speed,
            think_scale,
            done_at: vec![PENDING; WINDOW],
            ready_at: vec![0; WINDOW],
            waiting: vec![0; WINDOW],
            think: vec![0; WINDOW],
            first_child: vec![NONE; WINDOW],
            next_child: vec![[NONE; 2]; WINDOW],
            ready: BinaryHeap::with_capacity(WINDOW),
            admitted: 0,
            low: 0,
            low_at: i64::MIN,
            barriers: VecDeque::with_capacity(1024),
        }
    }

    /// The next row to admit.
    pub fn admitted(&self) -> u64 {
        self.admitted
    }

    /// Whether the window has room for the next row.
    pub fn has_room(&self) -> bool {
        self.admitted < self.low + WINDOW as u64
    }

    /// Admit the next row (rows come in order): it is ready at once when it has no parents or
    /// they have completed, else it waits for them. Call only when `has_room`.
    pub fn admit(&mut self, ts_ns: i64, deps: Deps) {
        let row = self.admitted;
        debug_assert!(self.has_room());
        let s = (row & MASK) as usize;
        self.done_at[s] = PENDING;
        self.first_child[s] = NONE;
        self.next_child[s] = [NONE; 2];
        self.think[s] = deps.think_ns;
        self.ready_at[s] = i64::MIN;
        self.waiting[s] = 0;
        let mut any = false;
        for (k, &back) in deps.parents.iter().enumerate() {
            if k == 1 && back == BARRIER && row > 0 {
                any = true;
                if self.low >= row {
                    self.ready_at[s] = self.ready_at[s].max(self.low_at);
                } else {
                    self.barriers.push_back(row);
                    self.waiting[s] += 1;
                }
                continue;
            }
            if back == 0 || back as u64 > row || back as usize >= WINDOW {
                continue;
            }
            any = true;
            let p = row - back as u64;
            let ps = (p & MASK) as usize;
            if self.done_at[ps] != PENDING {
                self.ready_at[s] = self.ready_at[s].max(self.done_at[ps]);
            } else {
                // Wait: link this row into the parent's list of children.
                self.next_child[s][k] = self.first_child[ps];
                self.first_child[ps] = row << 1 | k as u64;
                self.waiting[s] += 1;
            }
        }
        self.admitted += 1;
        if !any {
            self.ready.push(Reverse((crate::clock::intended_ns(ts_ns, self.speed), row)));
        } else if self.waiting[s] == 0 {
            self.ready.push(Reverse((self.due(s), row)));
        }
    }

    /// When row `s` is due: when its last parent completed plus its scaled think time. Inputs
    /// are checked (`Chunk::with_deps`), yet the sum saturates rather than wrap: a wrapped due
    /// time would be far in the past and issue the row at once.
    fn due(&self, s: usize) -> i64 {
        self.ready_at[s].saturating_add(scaled_think(self.think[s], self.think_scale))
    }

    /// The ready row due first, as (due, row), without taking it.
    pub fn peek(&self) -> Option<(i64, u64)> {
        self.ready.peek().map(|r| r.0)
    }

    /// Take the ready row due first.
    pub fn pop(&mut self) -> Option<(i64, u64)> {
        self.ready.pop().map(|r| r.0)
    }

    /// Row `row` completed at `at` (relative to the run's start), successfully or not: its
    /// children waiting only for it become ready.
    pub fn complete(&mut self, row: u64, at: i64) {
        let s = (row & MASK) as usize;
        self.done_at[s] = at;
        let mut link = self.first_child[s];
        while link != NONE {
            let (child, k) = (link >> 1, (link & 1) as usize);
            let cs = (child & MASK) as usize;
            link = self.next_child[cs][k];
            self.ready_at[cs] = self.ready_at[cs].max(at);
            self.waiting[cs] -= 1;
            if self.waiting[cs] == 0 {
                self.ready.push(Reverse((self.due(cs), child)));
            }
        }
        self.first_child[s] = NONE;
        let before = self.low;
        while self.low < self.admitted && self.done_at[(self.low & MASK) as usize] != PENDING {
            self.low += 1;
        }
        if self.low > before {
            // Completions come in time order: every row below `low` completed by now.
            self.low_at = self.low_at.max(at);
            while self.barriers.front().is_some_and(|&b| b <= self.low) {
                let b = self.barriers.pop_front().expect("front");
                let bs = (b & MASK) as usize;
                self.ready_at[bs] = self.ready_at[bs].max(self.low_at);
                self.waiting[bs] -= 1;
                if self.waiting[bs] == 0 {
                    self.ready.push(Reverse((self.due(bs), b)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deps(p: u32, q: u32, think: i64) -> Deps {
        Deps { parents: [p, q], think_ns: think }
    }

    #[test]
    fn roots_are_due_at_their_time_and_children_after_their_parents() {
        let mut s = Scheduler::new(1.0, 1.0);
        s.admit(100, deps(0, 0, 0)); // row 0: root
        s.admit(150, deps(1, 0, 30)); // row 1: waits for row 0, then 30 ns
        s.admit(120, deps(0, 0, 0)); // row 2: root, must not wait behind row 1
        assert_eq!(s.pop(), Some((100, 0)));
        assert_eq!(s.pop(), Some((120, 2)));
        assert_eq!(s.pop(), None);
        s.complete(2, 130);
        assert_eq!(s.pop(), None);
        s.complete(0, 500);
        assert_eq!(s.pop(), Some((530, 1)));
    }

    #[test]
    fn two_parents_wait_for_the_later_and_think_scales() {
        let mut s = Scheduler::new(2.0, 0.5);
        s.admit(1000, deps(0, 0, 0));
        s.admit(1000, deps(0, 0, 0));
        s.admit(5000, deps(1, 2, 100));
        assert_eq!(s.pop(), Some((500, 0)));
        assert_eq!(s.pop(), Some((500, 1)));
        s.complete(1, 700);
        assert_eq!(s.pop(), None);
        s.complete(0, 900);
        assert_eq!(s.pop(), Some((950, 2)));
    }

    #[test]
    fn a_barrier_waits_for_every_earlier_row() {
        let mut s = Scheduler::new(1.0, 1.0);
        s.admit(0, deps(0, 0, 0));
        s.admit(0, deps(0, 0, 0));
        s.admit(10, deps(1, BARRIER, 7)); // row 2: after row 1 and after rows 0 and 1
        s.pop();
        s.pop();
        s.complete(1, 50);
        assert_eq!(s.pop(), None, "row 0 has not completed");
        s.complete(0, 80);
        assert_eq!(s.pop(), Some((87, 2)));
        s.admit(90, deps(0, BARRIER, 3)); // row 3: rows 0..2 are not all done (2 is not)
        assert_eq!(s.pop(), None);
        s.complete(2, 100);
        assert_eq!(s.pop(), Some((103, 3)));
    }

    #[test]
    fn a_think_time_past_i64_saturates_instead_of_wrapping() {
        for scale in [1.0, 2.0, 1e308] {
            let mut s = Scheduler::new(1.0, scale);
            s.admit(0, deps(0, 0, 0));
            s.admit(0, deps(1, 0, i64::MAX)); // row 1: i64::MAX after row 0
            s.admit(0, deps(2, 0, i64::MAX / 2 + 1)); // row 2: after row 0; doubled, past i64::MAX
            assert_eq!(s.pop(), Some((0, 0)));
            s.complete(0, 1_000);
            let mut due = [s.pop(), s.pop()];
            due.sort();
            let want = if scale == 1.0 {
                [Some((i64::MAX / 2 + 1_001, 2)), Some((i64::MAX, 1))]
            } else {
                [Some((i64::MAX, 1)), Some((i64::MAX, 2))]
            };
            assert_eq!(due, want, "think scale {scale}");
        }
    }

    #[test]
    fn a_completed_parent_is_read_from_the_ring_and_the_window_bounds_admission() {
        let mut s = Scheduler::new(1.0, 1.0);
        s.admit(0, deps(0, 0, 0));
        s.pop();
        s.complete(0, 10);
        s.admit(20, deps(1, 0, 5));
        assert_eq!(s.pop(), Some((15, 1)));
        // Row 1 never completes: the window fills and stays full.
        for i in 2..WINDOW as u64 + 1 {
            assert!(s.has_room());
            s.admit(i as i64, deps(0, 0, 0));
        }
        assert!(!s.has_room());
        s.complete(1, 30);
        for r in 2..WINDOW as u64 + 1 {
            s.complete(r, 40);
        }
        assert!(s.has_room());
    }
}

//! The memory I/Os read into and write from: two aligned buffers allocated once per run.
//!
//! Reads land in a scratch area of one slot per I/O in flight (capped), used in turn, as fio
//! gives each I/O its own buffer: concurrent reads do not copy into the same pages (one
//! shared read page cost 39 % of 4 KiB random-read IOPS on zram at QD32), and the area stays
//! small enough to live in cache. Writes take their bytes from a pool of prepared data at a
//! position hashed from the row, so consecutive writes do not carry identical blocks.
//! Nothing is allocated per I/O.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// O_DIRECT needs buffers aligned to the logical block size; 4 KiB covers every device here.
pub const ALIGN: usize = 4096;

/// The longest read or write there are buffers for: Linux's MAX_RW_COUNT, the most one
/// read or write system call transfers (2 GiB less 4 KiB). It fits the 32 bits of an SQE.
pub const MAX_DATA_LENGTH: usize = 0x7fff_f000;

/// What writes carry. Compressing controllers score differently on each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DataPattern {
    /// Incompressible pseudo-random bytes (the default).
    Random,
    Zeros,
    /// This percentage of every 4 KiB block is zeros, the rest random.
    Compressible(u8),
}

impl DataPattern {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(Self::Random),
            "zeros" => Ok(Self::Zeros),
            _ => match s.strip_prefix("compressible:").map(str::parse::<u8>) {
                Some(Ok(p)) if p <= 100 => Ok(Self::Compressible(p)),
                _ => Err(format!(
                    "unknown data pattern '{s}': use random, zeros or compressible:PCT with PCT from 0 to 100"
                )),
            },
        }
    }
}

pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; the engine hands raw pointers into
// it to the kernel and to its own I/O threads, never creating Rust references to the bytes
// while I/O may be writing them.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Self {
        let len = len.max(ALIGN).next_multiple_of(ALIGN);
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory allocating a {len}-byte I/O buffer");
        Self { ptr, len }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Fill with `pattern`; called before any I/O uses the buffer.
    pub fn fill(&mut self, pattern: DataPattern, seed: u64) {
        // SAFETY: no I/O is in flight yet, so this is the only access to the bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) };
        let zero_share = match pattern {
            DataPattern::Random => 0,
            DataPattern::Zeros => 100,
            DataPattern::Compressible(p) => p as usize,
        };
        let random_len = ALIGN * (100 - zero_share) / 100;
        let mut state = seed | 1;
        for block in bytes.chunks_mut(ALIGN) {
            for word in block[..random_len].chunks_mut(8) {
                state = splitmix64(state);
                word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
            }
            block[random_len..].fill(0);
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, ALIGN).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with this same layout; no I/O outlives the buffers
        // (the engine reaps everything in flight before it drops them).
        unsafe { dealloc(self.ptr, layout) };
    }
}

#[inline]
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The buffers of one run.
pub struct Buffers {
    pub read: AlignedBuf,
    pub pool: AlignedBuf,
    read_slot: usize,
    /// How many slots the read area holds.
    read_slots: usize,
    /// `read_slots - 1` when that count is a power of two, as it mostly is (a depth of 1, 32,
    /// 1024): a mask then picks a read's slot instead of a 64-bit division, which cost the
    /// null engine's thread 1.5-2.5 of its 40 ns a row at QD1.
    read_mask: Option<usize>,
}

impl Buffers {
    /// `max_length` is the longest read or write of the trace (discards and flushes carry no
    /// data), `depth` the most I/Os in flight.
    pub fn new(max_length: usize, depth: usize, pattern: DataPattern) -> Self {
        assert!(max_length <= MAX_DATA_LENGTH, "no buffers for {max_length}-byte I/Os: at most {MAX_DATA_LENGTH}");
        let slot = max_length.max(1).next_multiple_of(ALIGN);
        let pool_size = (2 * slot).max(8 << 20);
        let read = AlignedBuf::zeroed(slot * depth.clamp(1, pool_size / slot));
        let mut pool = AlignedBuf::zeroed(pool_size);
        pool.fill(pattern, 0x7472_6163_6572_6570);
        let read_slots = read.len() / slot;
        let read_mask = read_slots.is_power_of_two().then(|| read_slots - 1);
        Self { read, pool, read_slot: slot, read_slots, read_mask }
    }

    /// The longest read or write these buffers hold.
    pub fn max_length(&self) -> usize {
        self.read_slot
    }

    /// Where the write of row `row`, `len` bytes long, takes its data: an aligned position
    /// in the pool picked by hashing the row. Panics if `len` exceeds `max_length()`: the
    /// caller validated lengths, and a pointer past the pool must never be made.
    #[inline]
    pub fn write_source(&self, row: u64, len: usize) -> *const u8 {
        assert!(len <= self.read_slot, "a {len}-byte write is longer than the {}-byte buffers", self.read_slot);
        let slots = ((self.pool.len() - len.next_multiple_of(ALIGN)) / ALIGN + 1) as u64;
        // The hash's high bits scaled onto 0..slots (multiply-shift): a 64-bit division per
        // write was 27 ns of the pool threads' time per write on zram (perf, 70/30).
        let slot = ((splitmix64(row) as u128 * slots as u128) >> 64) as u64;
        // SAFETY: slot * ALIGN + len <= pool.len() by the choice of `slots`, and
        // len <= read_slot <= pool.len() / 2, so the subtraction above cannot wrap.
        unsafe { self.pool.ptr().add(slot as usize * ALIGN) }
    }

    /// Where the read of row `row`, `len` bytes long, puts its data: the read area's slots in
    /// turn. Panics if `len` exceeds `max_length()`.
    #[inline]
    pub fn read_destination(&self, row: u64, len: usize) -> *mut u8 {
        assert!(len <= self.read_slot, "a {len}-byte read is longer than the {}-byte buffers", self.read_slot);
        let slot = match self.read_mask {
            Some(mask) => row as usize & mask,
            None => row as usize % self.read_slots,
        };
        // SAFETY: slot < number of slots, so the slot (read_slot >= len bytes) lies inside
        // the read area.
        unsafe { self.read.ptr().add(slot * self.read_slot) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse() {
        assert_eq!(DataPattern::parse("random"), Ok(DataPattern::Random));
        assert_eq!(DataPattern::parse("zeros"), Ok(DataPattern::Zeros));
        assert_eq!(DataPattern::parse("compressible:40"), Ok(DataPattern::Compressible(40)));
        assert!(DataPattern::parse("compressible:140").is_err());
        assert!(DataPattern::parse("ones").is_err());
    }

    #[test]
    fn buffers_are_aligned_and_sources_stay_inside_the_pool() {
        let b = Buffers::new(1 << 20, 64, DataPattern::Random);
        assert_eq!(b.read.ptr() as usize % ALIGN, 0);
        assert_eq!(b.pool.ptr() as usize % ALIGN, 0);
        for row in 0..10_000u64 {
            let len = 4096 * (1 + row as usize % 256);
            for (p, buf) in [(b.write_source(row, len), &b.pool), (b.read_destination(row, len).cast_const(), &b.read)] {
                let (p, start) = (p as usize, buf.ptr() as usize);
                assert_eq!(p % ALIGN, 0);
                assert!(p >= start && p + len <= start + buf.len());
            }
        }
    }

    #[test]
    fn reads_take_the_slots_in_turn_whatever_their_count() {
        // 1, 3 and 4 slots (a mask picks among a power of two of them, a division among 3).
        for depth in [1usize, 3, 4] {
            let b = Buffers::new(4096, depth, DataPattern::Zeros);
            let start = b.read.ptr() as usize;
            let slots: Vec<usize> = (0..9u64).map(|row| (b.read_destination(row, 4096) as usize - start) / 4096).collect();
            assert_eq!(slots, (0..9).map(|row| row % depth).collect::<Vec<_>>(), "{depth} slots");
        }
    }

    #[test]
    #[should_panic(expected = "longer than")]
    fn a_read_longer_than_the_buffers_is_refused() {
        Buffers::new(4096, 4, DataPattern::Zeros).read_destination(0, 8192);
    }

    #[test]
    #[should_panic(expected = "longer than")]
    fn a_write_longer_than_the_buffers_is_refused() {
        // The pool is 8 MiB, but the buffers were built for 4 KiB I/Os.
        Buffers::new(4096, 4, DataPattern::Zeros).write_source(0, 1 << 20);
    }

    #[test]
    fn compressible_share_is_zeros() {
        let mut buf = AlignedBuf::zeroed(64 * ALIGN);
        buf.fill(DataPattern::Compressible(75), 1);
        let bytes = unsafe { std::slice::from_raw_parts(buf.ptr(), buf.len()) };
        let zeros = bytes.iter().filter(|&&b| b == 0).count() as f64 / bytes.len() as f64;
        assert!((zeros - 0.75).abs() < 0.01, "zero share {zeros}");
        buf.fill(DataPattern::Random, 1);
        let bytes = unsafe { std::slice::from_raw_parts(buf.ptr(), buf.len()) };
        let zeros = bytes.iter().filter(|&&b| b == 0).count() as f64 / bytes.len() as f64;
        assert!(zeros < 0.01, "zero share {zeros}");
    }
}

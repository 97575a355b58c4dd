//! Reading the plain lines of a delimited text format (NetApp controller CSV) into columns,
//! faster than pyarrow's read_csv, which tokenises and checks every field of every line: a
//! line's separators are found by vector compares, only the columns kept are converted (16
//! digits at a time with AVX2, 8 without), and the rest are passed over. It reads the simple
//! case alone and gives up on anything else (`None`), which pyarrow then reads as before,
//! errors included (traces.formats.reading.read_blocks). It replaced a Numba kernel, whose
//! loading alone took 0.15 s of an import.

/// What becomes of one field of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Not kept: any text but a comma, CR or LF.
    Skip,
    /// An optional minus and 1-18 digits, into an i64 column.
    Integer,
    /// 1-15 digits, then optionally a point and 1-3 digits, into an f64 column (the float
    /// nearest the decimal, as a correctly rounding parser gives).
    Decimal,
}

/// One kept column, in the order of the fields.
#[derive(Debug, PartialEq)]
pub enum Column {
    Integer(Vec<i64>),
    Decimal(Vec<f64>),
}

/// The columns read from a buffer and the LFs in it.
#[derive(Debug, PartialEq)]
pub struct Lines {
    pub columns: Vec<Column>,
    pub newlines: u64,
}

impl Lines {
    pub fn rows(&self) -> usize {
        match self.columns.first() {
            Some(Column::Integer(v)) => v.len(),
            Some(Column::Decimal(v)) => v.len(),
            None => 0,
        }
    }
}

// Decimals become exact integers of thousandths, then floats: only below 2^53 is that float
// the one a correctly rounding parser (pyarrow's) gives.
const MAX_THOUSANDTHS: u64 = 1 << 53;
const MAX_INTEGER_DIGITS: usize = 18; // past them an i64 may overflow: pyarrow reads those
const MAX_WHOLE_DIGITS: usize = 15;
const MAX_PLACES: usize = 3;
const COMMA: u8 = b',';
const LF: u8 = b'\n';
const CR: u8 = b'\r';
const DOT: u8 = b'.';
const MINUS: u8 = b'-';

// Eight bytes at once (SWAR): a byte repeated in each byte of a u64.
const ZEROS: u64 = 0x3030_3030_3030_3030;
const NIBBLE: u64 = 0xF0F0_F0F0_F0F0_F0F0;
const SIXES: u64 = 0x0606_0606_0606_0606;
const DOTS: u64 = 0x2E2E_2E2E_2E2E_2E2E;
const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
const POW10: [u64; 9] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];

/// Blocks smaller than this are read on one thread: a thread costs more than it saves there.
pub const HALVES_FROM: usize = 1 << 20;

/// The bytes of a line the fast path reads at once: a longer line is read byte by byte.
const WIDE: usize = 128;

/// The 8 bytes of `buf` from `at` as one little-endian u64; past the end, zero bytes.
#[inline(always)]
fn load(buf: &[u8], at: usize) -> u64 {
    match buf.get(at..at + 8) {
        Some(bytes) => u64::from_le_bytes(bytes.try_into().expect("8 bytes")),
        None => {
            let mut bytes = [0u8; 8];
            let rest = &buf[at.min(buf.len())..];
            bytes[..rest.len()].copy_from_slice(rest);
            u64::from_le_bytes(bytes)
        }
    }
}

/// The 8 bytes of `buf` that end at `end` (>= 8), the last in the highest byte.
#[inline(always)]
fn load_before(buf: &[u8], end: usize) -> u64 {
    u64::from_le_bytes(buf[end - 8..end].try_into().expect("8 bytes"))
}

/// The bytes of `w` that are not ASCII digits, each marked by a nonzero byte; exact up to the
/// first (a carry may mark the bytes after it).
#[inline(always)]
fn non_digits(w: u64) -> u64 {
    ((w & NIBBLE) ^ ZEROS) | ((w.wrapping_add(SIXES) & NIBBLE) ^ ZEROS)
}

/// The high bit of each zero byte of x set, all of them exact.
#[inline(always)]
fn each_zero_byte(x: u64) -> u64 {
    !(((x & LOW7).wrapping_add(LOW7)) | x | LOW7)
}

/// The low `k` bytes of a u64 (k <= 8).
#[inline(always)]
fn low_bytes(k: usize) -> u64 {
    u64::MAX.checked_shl(8 * k as u32).map_or(u64::MAX, |high| !high)
}

/// The low `k` bits of a u64 (any k; all of them from 64).
#[inline(always)]
fn low_bits(k: usize) -> u64 {
    u64::MAX.checked_shl(k as u32).map_or(u64::MAX, |high| !high)
}

/// The high `k` bytes of a u64 (k <= 8).
#[inline(always)]
fn high_bytes(k: usize) -> u64 {
    u64::MAX.checked_shr(8 * k as u32).map_or(u64::MAX, |low| !low)
}

/// `w` with the bytes outside `keep` made '0'.
#[inline(always)]
fn zero_padded(w: u64, keep: u64) -> u64 {
    (w & keep) | (ZEROS & !keep)
}

/// The number in 8 digit values (0-9, the first in the lowest byte), in 3 multiplications.
#[inline(always)]
fn eight(t: u64) -> u64 {
    let t = t.wrapping_mul(10).wrapping_add(t >> 8);
    let mask = 0x0000_00FF_0000_00FF;
    ((t & mask).wrapping_mul(100 + (1_000_000 << 32)).wrapping_add(((t >> 16) & mask).wrapping_mul(1 + (10_000 << 32))))
        >> 32
}

/// The number in the 8 ASCII bytes of `w` that are all digits (leading '0's pad a shorter one).
#[inline(always)]
fn eight_digits(w: u64) -> u64 {
    eight(w.wrapping_sub(ZEROS))
}

/// The value of the digits buf[start..end] (at most 19), or None when one is not a digit:
/// any length and place in `buf`, eight bytes at a time.
fn digits(buf: &[u8], start: usize, end: usize) -> Option<u64> {
    let mut value = 0u64;
    let mut at = start;
    while end - at >= 8 {
        let w = load(buf, at);
        if non_digits(w) != 0 {
            return None;
        }
        value = value * 100_000_000 + eight_digits(w);
        at += 8;
    }
    let k = end - at;
    if k > 0 {
        let w = load(buf, at);
        if non_digits(w) & low_bytes(k) != 0 {
            return None;
        }
        // The k digits moved to the top bytes, '0's below them.
        value = value * POW10[k] + eight_digits(zero_padded(w << (8 * (8 - k)), high_bytes(k)));
    }
    Some(value)
}

/// An integer field: an optional minus and 1-18 digits.
fn integer(buf: &[u8], start: usize, end: usize) -> Option<i64> {
    let negative = start < end && buf[start] == MINUS;
    let from = start + negative as usize;
    if from == end || end - from > MAX_INTEGER_DIGITS {
        return None;
    }
    let value = digits(buf, from, end)? as i64;
    Some(if negative { -value } else { value })
}

/// A decimal field: 1-15 digits, then optionally a point and 1-3 digits.
fn decimal(buf: &[u8], start: usize, end: usize) -> Option<f64> {
    let field = &buf[start..end];
    let whole = field.iter().take_while(|b| b.is_ascii_digit()).count();
    if whole == 0 || whole > MAX_WHOLE_DIGITS {
        return None;
    }
    let mut thousandths = digits(buf, start, start + whole)? * 1000;
    if whole < field.len() {
        let places = field.len() - whole - 1;
        if field[whole] != DOT || places == 0 || places > MAX_PLACES {
            return None;
        }
        thousandths += digits(buf, start + whole + 1, end)? * POW10[MAX_PLACES - places];
    }
    if thousandths >= MAX_THOUSANDTHS {
        return None;
    }
    Some(thousandths as f64 / 1000.0)
}

/// `integer` for a field that ends 16 bytes or more into `buf`: 1-16 digits in one or two
/// words read before its end, their bytes before the field made '0'. Others go to `integer`.
#[inline(always)]
fn integer_fast(buf: &[u8], start: usize, end: usize) -> Option<i64> {
    let len = end - start;
    if len.wrapping_sub(1) < 8 {
        let w = zero_padded(load_before(buf, end), high_bytes(len));
        if non_digits(w) == 0 {
            return Some(eight_digits(w) as i64);
        }
    } else if (9..=16).contains(&len) {
        let lo = load_before(buf, end);
        let hi = zero_padded(load_before(buf, end - 8), high_bytes(len - 8));
        if non_digits(lo) | non_digits(hi) == 0 {
            return Some((eight_digits(hi) * 100_000_000 + eight_digits(lo)) as i64);
        }
    }
    integer(buf, start, end)
}

/// `decimal` for a field that ends 16 bytes or more into `buf`, where a point is one of its
/// last four bytes and 1-8 digits come before it. Others go to `decimal`.
#[inline(always)]
fn decimal_fast(buf: &[u8], start: usize, end: usize) -> Option<f64> {
    let len = end - start;
    let w = load_before(buf, end);
    let points = each_zero_byte(w ^ DOTS) & high_bytes(len.min(4));
    if points != 0 {
        let point = end - 8 + (points.trailing_zeros() / 8) as usize;
        let places = end - point - 1;
        let whole = point - start;
        let fraction = zero_padded(w, high_bytes(places));
        if places > 0 && whole.wrapping_sub(1) < 8 {
            let before = zero_padded(load_before(buf, point), high_bytes(whole));
            if non_digits(fraction) | non_digits(before) == 0 {
                let thousandths = eight_digits(before) * 1000 + eight_digits(fraction) * POW10[MAX_PLACES - places];
                // 8 digits and 3 places are below 2^53 thousandths.
                return Some(thousandths as f64 / 1000.0);
            }
        }
    }
    decimal(buf, start, end)
}

/// The commas, LFs and CRs of 128 bytes as bit masks (bit i of [0]: byte i, of [1]: byte 64 + i).
#[derive(Clone, Copy)]
struct Marks {
    commas: [u64; 2],
    lfs: [u64; 2],
    crs: [u64; 2],
}

/// What a line's reading needs of the instruction set: one implementation each.
trait Scan {
    /// The separators of 128 bytes.
    fn marks(bytes: &[u8; WIDE]) -> Marks;
    /// The position of the k-th set bit of `mask` (from 0; it has more than k).
    fn select(mask: u64, k: usize) -> usize;
    /// `integer` for a field that ends 16 bytes or more into `buf`.
    fn integer(buf: &[u8], start: usize, end: usize) -> Option<i64> {
        integer_fast(buf, start, end)
    }
    /// `decimal` for a field that ends 16 bytes or more into `buf`.
    fn decimal(buf: &[u8], start: usize, end: usize) -> Option<f64> {
        decimal_fast(buf, start, end)
    }
}

/// The k-th set bit of `mask` by clearing the ones below it.
#[inline(always)]
fn select_by_clearing(mut mask: u64, k: usize) -> usize {
    for _ in 0..k {
        mask &= mask - 1;
    }
    mask.trailing_zeros() as usize
}

/// Byte by byte, for any machine.
#[allow(dead_code)] // on x86_64, where Sse2 stands in for it
struct Bytes;

impl Scan for Bytes {
    #[inline(always)]
    fn marks(bytes: &[u8; WIDE]) -> Marks {
        let mut m = Marks { commas: [0; 2], lfs: [0; 2], crs: [0; 2] };
        for (i, &b) in bytes.iter().enumerate() {
            m.commas[i / 64] |= ((b == COMMA) as u64) << (i % 64);
            m.lfs[i / 64] |= ((b == LF) as u64) << (i % 64);
            m.crs[i / 64] |= ((b == CR) as u64) << (i % 64);
        }
        m
    }

    #[inline(always)]
    fn select(mask: u64, k: usize) -> usize {
        select_by_clearing(mask, k)
    }
}

/// 16 bytes at a time (SSE2, which every x86_64 has).
#[cfg(target_arch = "x86_64")]
struct Sse2;

#[cfg(target_arch = "x86_64")]
impl Scan for Sse2 {
    #[inline(always)]
    fn marks(bytes: &[u8; WIDE]) -> Marks {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86_64; the unaligned loads read the 128 bytes of `bytes`.
        unsafe {
            let (comma, lf, cr) = (_mm_set1_epi8(COMMA as i8), _mm_set1_epi8(LF as i8), _mm_set1_epi8(CR as i8));
            let mut m = Marks { commas: [0; 2], lfs: [0; 2], crs: [0; 2] };
            for i in 0..WIDE / 16 {
                let v = _mm_loadu_si128(bytes.as_ptr().add(16 * i) as *const __m128i);
                let shift = 16 * (i % 4);
                m.commas[i / 4] |= (_mm_movemask_epi8(_mm_cmpeq_epi8(v, comma)) as u16 as u64) << shift;
                m.lfs[i / 4] |= (_mm_movemask_epi8(_mm_cmpeq_epi8(v, lf)) as u16 as u64) << shift;
                m.crs[i / 4] |= (_mm_movemask_epi8(_mm_cmpeq_epi8(v, cr)) as u16 as u64) << shift;
            }
            m
        }
    }

    #[inline(always)]
    fn select(mask: u64, k: usize) -> usize {
        select_by_clearing(mask, k)
    }
}

/// 32 bytes at a time, and PDEP to find the k-th comma; only inlined into
/// `read_lines_avx2`, which runs where both are (and PDEP is fast).
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Scan for Avx2 {
    #[inline(always)]
    fn marks(bytes: &[u8; WIDE]) -> Marks {
        use std::arch::x86_64::*;
        // SAFETY: inlined only into read_lines_avx2, called only where the CPU has AVX2; the
        // unaligned loads read the 128 bytes of `bytes`.
        unsafe {
            let (comma, lf, cr) = (_mm256_set1_epi8(COMMA as i8), _mm256_set1_epi8(LF as i8), _mm256_set1_epi8(CR as i8));
            let mut m = Marks { commas: [0; 2], lfs: [0; 2], crs: [0; 2] };
            for i in 0..WIDE / 32 {
                let v = _mm256_loadu_si256(bytes.as_ptr().add(32 * i) as *const __m256i);
                let shift = 32 * (i % 2);
                m.commas[i / 2] |= (_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, comma)) as u32 as u64) << shift;
                m.lfs[i / 2] |= (_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, lf)) as u32 as u64) << shift;
                m.crs[i / 2] |= (_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, cr)) as u32 as u64) << shift;
            }
            m
        }
    }

    #[inline(always)]
    fn select(mask: u64, k: usize) -> usize {
        // SAFETY: inlined only into read_lines_avx2, called only where the CPU has BMI2.
        unsafe { std::arch::x86_64::_pdep_u64(1u64.wrapping_shl(k as u32), mask).trailing_zeros() as usize }
    }

    #[inline(always)]
    fn integer(buf: &[u8], start: usize, end: usize) -> Option<i64> {
        let len = end - start;
        if len.wrapping_sub(1) < 16 {
            if let Some(value) = simd::digits(simd::last16(buf, end), len) {
                return Some(value as i64);
            }
        }
        integer(buf, start, end)
    }

    #[inline(always)]
    fn decimal(buf: &[u8], start: usize, end: usize) -> Option<f64> {
        let len = end - start;
        if len.wrapping_sub(1) < 16 {
            if let Some(thousandths) = simd::thousandths(simd::last16(buf, end), len) {
                return Some(thousandths as f64 / 1000.0);
            }
        }
        decimal(buf, start, end)
    }
}

/// Fields converted 16 bytes at a time (SSSE3 and SSE4.1, within `read_lines_avx2`): the 16
/// bytes that end a field, its digits in the last `len`.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// 16 zero bytes then 16 of 0xFF: the 16 from `len` keep the last `len` bytes.
    static KEEP: [u8; 32] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255];

    /// Shuffles that drop a point at byte 12, 13 or 14 (3, 2 or 1 places): the bytes before it
    /// move up one, byte 0 becomes a zero byte.
    static DROP_POINT: [[i8; 16]; 3] = [
        [-128, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15],
        [-128, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15],
        [-128, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15],
    ];

    /// The 16 bytes of `buf` that end at `end` (>= 16).
    #[inline(always)]
    pub fn last16(buf: &[u8], end: usize) -> __m128i {
        let bytes: &[u8; 16] = buf[end - 16..end].try_into().expect("16 bytes");
        // SAFETY: an unaligned load of the 16 bytes of `bytes` (SSE2).
        unsafe { _mm_loadu_si128(bytes.as_ptr() as *const __m128i) }
    }

    /// The number in the last `len` (1-16) bytes of `v`, or None when one is not a digit.
    #[inline(always)]
    pub fn digits(v: __m128i, len: usize) -> Option<u64> {
        // SAFETY: SSE2, SSSE3 and SSE4.1, which read_lines_avx2's CPU has (AVX2 implies them);
        // the mask is loaded from KEEP[len..len + 16], within its 32 bytes.
        unsafe {
            let keep = _mm_loadu_si128(KEEP.as_ptr().add(len) as *const __m128i);
            let values = _mm_and_si128(_mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8)), keep);
            // A byte that is not a digit is above 9 once '0' is taken away (wrapping).
            if _mm_testz_si128(_mm_subs_epu8(values, _mm_set1_epi8(9)), keep) == 0 {
                return None;
            }
            Some(number(values))
        }
    }

    /// The decimal in the last `len` (1-16) bytes of `v` (1-15 digits, then optionally a point
    /// and 1-3 digits) in thousandths, or None when it is anything else.
    #[inline(always)]
    pub fn thousandths(v: __m128i, len: usize) -> Option<u64> {
        // SAFETY: as in `digits`.
        unsafe {
            let keep = _mm_loadu_si128(KEEP.as_ptr().add(len) as *const __m128i);
            let points = (_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'.' as i8)), keep)) as u32) & 0xFFFF;
            let (v, digits, scale) = if points == 0 {
                if len > super::MAX_WHOLE_DIGITS {
                    return None;
                }
                (v, len, 1000)
            } else {
                let point = points.trailing_zeros() as usize;
                let places = 15 - point;
                if points != 1 << point || !(1..=super::MAX_PLACES).contains(&places) || len < places + 2 {
                    return None;
                }
                let drop = _mm_loadu_si128(DROP_POINT[3 - places].as_ptr() as *const __m128i);
                (_mm_shuffle_epi8(v, drop), len - 1, super::POW10[super::MAX_PLACES - places])
            };
            let keep = _mm_loadu_si128(KEEP.as_ptr().add(digits) as *const __m128i);
            let values = _mm_and_si128(_mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8)), keep);
            if _mm_testz_si128(_mm_subs_epu8(values, _mm_set1_epi8(9)), keep) == 0 {
                return None;
            }
            let thousandths = number(values) * scale;
            (thousandths < super::MAX_THOUSANDTHS).then_some(thousandths)
        }
    }

    /// The number in 16 digit values (0-9, the first in byte 0), in 4 multiply-adds.
    #[inline(always)]
    unsafe fn number(values: __m128i) -> u64 {
        let pairs = _mm_maddubs_epi16(values, _mm_setr_epi8(10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1));
        let fours = _mm_madd_epi16(pairs, _mm_setr_epi16(100, 1, 100, 1, 100, 1, 100, 1));
        let fours = _mm_packus_epi32(fours, fours);
        let eights = _mm_madd_epi16(fours, _mm_setr_epi16(10000, 1, 10000, 1, 0, 0, 0, 0));
        let both = _mm_cvtsi128_si64(eights) as u64;
        (both & 0xFFFF_FFFF) * 100_000_000 + (both >> 32)
    }
}

/// Whether PDEP takes a cycle or so: everywhere it exists but on AMD before Zen 3 (family
/// 19h) and Hygon's Zen-based CPUs, which run it in microcode, taking hundreds.
#[cfg(target_arch = "x86_64")]
fn pdep_is_fast() -> bool {
    use std::arch::x86_64::__cpuid;
    let vendor = __cpuid(0);
    let vendor = (vendor.ebx, vendor.edx, vendor.ecx);
    let amd = vendor == (0x6874_7541, 0x6974_6E65, 0x444D_4163); // "AuthenticAMD"
    let hygon = vendor == (0x6F67_7948, 0x6E65_476E, 0x656E_6975); // "HygonGenuine"
    let signature = __cpuid(1).eax;
    let family = (signature >> 8) & 0xF;
    let family = if family == 0xF { family + ((signature >> 20) & 0xFF) } else { family };
    !hygon && (!amd || family >= 0x19)
}

/// The kept columns being written, each with room for every row the buffer can hold.
struct Out {
    ints: Vec<Vec<i64>>,
    floats: Vec<Vec<f64>>,
    rows: usize,
}

impl Out {
    #[inline(always)]
    fn put<S: Scan>(&mut self, kind: Kind, slot: usize, buf: &[u8], start: usize, end: usize, fast: bool) -> Option<()> {
        let row = self.rows;
        match kind {
            Kind::Integer => {
                let value = if fast { S::integer(buf, start, end) } else { integer(buf, start, end) }?;
                self.ints[slot].spare_capacity_mut()[row].write(value);
            }
            _ => {
                let value = if fast { S::decimal(buf, start, end) } else { decimal(buf, start, end) }?;
                self.floats[slot].spare_capacity_mut()[row].write(value);
            }
        }
        Some(())
    }
}

/// A kept field: its index, kind and slot among the columns of its kind.
#[derive(Clone, Copy)]
struct Kept {
    field: usize,
    kind: Kind,
    slot: usize,
}

/// Read the lines of `buf` (comma-separated, each with kinds.len() fields) into the kept
/// columns, or None when a line is anything else: a field count, character or value this
/// reader does not read (a quote in a kept field, a space, an exponent, a lone CR, "nan"...),
/// for pyarrow to read instead. Empty lines are passed over, a line may end in CR LF, the
/// last one needs no LF. At least one field must be kept.
pub fn read_lines(buf: &[u8], kinds: &[Kind]) -> Option<Lines> {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("bmi1")
            && is_x86_feature_detected!("bmi2")
            && is_x86_feature_detected!("popcnt")
            && pdep_is_fast()
        {
            // SAFETY: the CPU has the features read_lines_avx2 is compiled for.
            return unsafe { read_lines_avx2(buf, kinds) };
        }
        read_lines_with::<Sse2>(buf, kinds)
    }
    #[cfg(not(target_arch = "x86_64"))]
    read_lines_with::<Bytes>(buf, kinds)
}

/// read_lines compiled for AVX2 with POPCNT, TZCNT and PDEP (the baseline x86_64 has none of
/// them, and counts bits in a dozen instructions).
///
/// # Safety
/// Only where the CPU has AVX2, BMI1, BMI2 and POPCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
unsafe fn read_lines_avx2(buf: &[u8], kinds: &[Kind]) -> Option<Lines> {
    read_lines_with::<Avx2>(buf, kinds)
}

#[inline(always)]
fn read_lines_with<S: Scan>(buf: &[u8], kinds: &[Kind]) -> Option<Lines> {
    let n = buf.len();
    let fields = kinds.len();
    let mut kept = Vec::new();
    let (mut ints, mut floats) = (0, 0);
    for (field, &kind) in kinds.iter().enumerate() {
        let counter = match kind {
            Kind::Skip => continue,
            Kind::Integer => &mut ints,
            Kind::Decimal => &mut floats,
        };
        kept.push(Kept { field, kind, slot: *counter });
        *counter += 1;
    }
    if kept.is_empty() {
        return None;
    }
    // A line holds a comma between fields and an LF (or the end), and a kept field a digit:
    // at most one row a `fields` bytes. Untouched, the pages of the rest are never used.
    let room = n / fields + 1;
    let mut out = Out {
        ints: (0..ints).map(|_| Vec::with_capacity(room)).collect(),
        floats: (0..floats).map(|_| Vec::with_capacity(room)).collect(),
        rows: 0,
    };
    let mut newlines = 0u64;
    let mut pos = 0;
    // Lines that start 16 bytes or more into `buf` and end within WIDE bytes of it, their
    // separators all found at once; the others (and any line the fast path does not take)
    // byte by byte.
    while pos < n {
        if pos < 16 || pos + WIDE > n {
            pos = read_line(buf, pos, fields, &kept, &mut out, &mut newlines)?;
            continue;
        }
        let m = S::marks(buf[pos..pos + WIDE].try_into().expect("WIDE bytes"));
        // The line ends at its first LF; bytes and masks below `lf` are the line's.
        let lf = if m.lfs[0] != 0 {
            m.lfs[0].trailing_zeros() as usize
        } else if m.lfs[1] != 0 {
            64 + m.lfs[1].trailing_zeros() as usize
        } else {
            pos = read_line(buf, pos, fields, &kept, &mut out, &mut newlines)?;
            continue;
        };
        let within = [low_bits(lf), low_bits(lf.saturating_sub(64))];
        let mut end = lf; // where the last field ends (before a CR that ends the line)
        let crs = [m.crs[0] & within[0], m.crs[1] & within[1]];
        if crs != [0, 0] {
            // Only a CR right before the LF: a lone one ends a line for pyarrow.
            let cr = lf - 1;
            let mut only = [0u64; 2];
            only[cr / 64] = 1 << (cr % 64);
            if crs != only {
                return None;
            }
            end = cr;
        }
        newlines += 1;
        if end == 0 {
            pos += lf + 1; // an empty line, passed over
            continue;
        }
        let commas = [m.commas[0] & within[0], m.commas[1] & within[1]];
        let low = commas[0].count_ones() as usize;
        if low + commas[1].count_ones() as usize + 1 != fields {
            return None;
        }
        // Field f starts after comma f-1 and ends at comma f (the last at `end`).
        let comma = |j: usize| if j < low { S::select(commas[0], j) } else { 64 + S::select(commas[1], j - low) };
        for k in &kept {
            let start = if k.field == 0 { 0 } else { comma(k.field - 1) + 1 };
            let stop = if k.field + 1 == fields { end } else { comma(k.field) };
            out.put::<S>(k.kind, k.slot, buf, pos + start, pos + stop, true)?;
        }
        out.rows += 1;
        pos += lf + 1;
    }
    let rows = out.rows;
    let mut columns = Vec::with_capacity(kept.len());
    let (mut ints, mut floats) = (out.ints.into_iter(), out.floats.into_iter());
    for k in &kept {
        columns.push(match k.kind {
            Kind::Integer => Column::Integer(ints.next().expect("a column per kept field")),
            _ => Column::Decimal(floats.next().expect("a column per kept field")),
        });
    }
    for column in &mut columns {
        // SAFETY: rows 0..rows of every column were written (put), within its capacity.
        unsafe {
            match column {
                Column::Integer(v) => v.set_len(rows),
                Column::Decimal(v) => v.set_len(rows),
            }
        }
    }
    Some(Lines { columns, newlines })
}

/// The line of `buf` that starts at `pos`, read byte by byte into `out` (an empty one passed
/// over): where the next starts, or None when it is not a line the fast reader reads.
fn read_line(buf: &[u8], pos: usize, fields: usize, kept: &[Kept], out: &mut Out, newlines: &mut u64) -> Option<usize> {
    let rest = &buf[pos..];
    let (mut end, next) = match rest.iter().position(|&b| b == LF) {
        Some(lf) => {
            *newlines += 1;
            (pos + lf, pos + lf + 1)
        }
        None => (buf.len(), buf.len()),
    };
    if end > pos && buf[end - 1] == CR && next > end {
        end -= 1;
    }
    let line = &buf[pos..end];
    if line.contains(&CR) {
        return None; // a lone CR, which ends a line for pyarrow
    }
    if line.is_empty() {
        return Some(next);
    }
    let mut bounds = Vec::with_capacity(fields + 1);
    bounds.push(pos);
    bounds.extend(line.iter().enumerate().filter(|(_, &b)| b == COMMA).map(|(i, _)| pos + i + 1));
    if bounds.len() != fields {
        return None;
    }
    bounds.push(end + 1);
    for k in kept {
        out.put::<Bytes>(k.kind, k.slot, buf, bounds[k.field], bounds[k.field + 1] - 1, false)?;
    }
    out.rows += 1;
    Some(next)
}

/// Where the line after byte `at` of `buf` starts, or None when no LF follows it.
fn line_after(buf: &[u8], at: usize) -> Option<usize> {
    buf[at..].iter().position(|&b| b == LF).map(|i| at + i + 1)
}

/// read_lines on two halves of `buf` at once (the second on a thread of its own), joined;
/// a buffer under HALVES_FROM bytes on this thread alone.
pub fn read_lines_in_halves(buf: &[u8], kinds: &[Kind]) -> Option<Lines> {
    let middle = if buf.len() >= HALVES_FROM { line_after(buf, buf.len() / 2) } else { None };
    let Some(middle) = middle.filter(|&m| m < buf.len()) else {
        return read_lines(buf, kinds);
    };
    let (first, second) = std::thread::scope(|scope| {
        let second = scope.spawn(|| read_lines(&buf[middle..], kinds));
        let first = read_lines(&buf[..middle], kinds);
        (first, second.join().expect("the second half's reader does not panic"))
    });
    let (mut first, second) = (first?, second?);
    for (a, b) in first.columns.iter_mut().zip(second.columns) {
        match (a, b) {
            (Column::Integer(a), Column::Integer(b)) => a.extend_from_slice(&b),
            (Column::Decimal(a), Column::Decimal(b)) => a.extend_from_slice(&b),
            _ => unreachable!("both halves have the same columns"),
        }
    }
    first.newlines += second.newlines;
    Some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Kind::{Decimal as D, Integer as I, Skip as S};

    fn ints(c: &Column) -> &[i64] {
        match c {
            Column::Integer(v) => v,
            _ => panic!("not integers"),
        }
    }

    fn floats(c: &Column) -> &[f64] {
        match c {
            Column::Decimal(v) => v,
            _ => panic!("not decimals"),
        }
    }

    #[test]
    fn kept_columns_are_read_and_the_others_passed_over() {
        let got = read_lines(b"1.5,2,x,3\n0.25,-7,y y,4.125\n", &[D, I, S, D]).unwrap();
        assert_eq!(floats(&got.columns[0]), [1.5, 0.25]);
        assert_eq!(ints(&got.columns[1]), [2, -7]);
        assert_eq!(floats(&got.columns[2]), [3.0, 4.125]);
        assert_eq!(got.newlines, 2);
    }

    #[test]
    fn empty_lines_crlf_and_a_last_line_without_lf_are_read() {
        let got = read_lines(b"\n1,2\r\n\r\n\n3,4", &[I, I]).unwrap();
        assert_eq!(ints(&got.columns[0]), [1, 3]);
        assert_eq!(ints(&got.columns[1]), [2, 4]);
        assert_eq!(got.newlines, 4);
    }

    #[test]
    fn lines_longer_than_a_window_are_read() {
        let skipped = "z".repeat(150);
        let line = format!("{skipped},123456789012345678,{skipped},123456789012.345\n");
        let got = read_lines(line.repeat(3).as_bytes(), &[S, I, S, D]).unwrap();
        assert_eq!(ints(&got.columns[0]), [123456789012345678; 3]);
        assert_eq!(floats(&got.columns[1]), [123456789012.345; 3]);
    }

    #[test]
    fn what_it_does_not_read_is_none() {
        for block in [
            &b"1.5,2,x\n"[..],
            b"1.5,2,x,3,4\n",
            b"1.5,2,x,nan\n",
            b"1.5, 2,x,3\n",
            b"1.5,2,x,3\r4\n",
            b"1.5,2,x\r,3\n",
            b"1.5e3,2,x,3\n",
            b"1.5,2,x,3.1234\n",
            b"-1.5,2,x,3\n",
            b"1.5,,x,3\n",
            b"1.,2,x,3\n",
            b".5,2,x,3\n",
            b"1.5,1234567890123456789,x,3\n",
            b"1.5,-,x,3\n",
            b"1.5,2,x,3\r",
            b"9007199254740.992,2,x,3\n",
        ] {
            assert_eq!(read_lines(block, &[D, I, S, D]), None, "{}", String::from_utf8_lossy(block));
        }
        assert!(read_lines(b"9007199254740.991,2,x,3\n", &[D, I, S, D]).is_some());
        assert_eq!(read_lines(b"a,b\n", &[S, S]), None, "no kept field");
    }

    /// A xorshift generator: the same blocks on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.below(from.len())]
        }
    }

    #[test]
    fn every_instruction_set_reads_alike() {
        // Blocks of mostly plain lines with odd ones among them, read by each implementation
        // this machine runs: the same columns, or None from every one.
        let integers = ["0", "7", "-12", "00012", "123456789", "1234567890123456", "12345678901234567", "123456789012345678"];
        let decimals = ["1.5", "0.001", "123456.789", "7", "12345678.12", "123456789012.345", "99999999999"];
        let odd = ["", " 5", "+5", "1.", ".5", "1.2345", "5e3", "nan", "1.2.3", "-1.5", "a\rb", "1234567890123456789", "9007199254740.993", "x y"];
        let texts = ["RD", "WR", "x y", "", "\"q\"", "a-long-field-of-text-past-sixteen-bytes"];
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let (mut read, mut refused) = (0, 0);
        for _ in 0..3000 {
            let kinds: Vec<Kind> = (0..[2, 4, 8, 16][rng.below(4)]).map(|_| [S, I, D][rng.below(3)]).collect();
            let mut text = String::new();
            for _ in 0..rng.below(60) + 1 {
                let line: Vec<&str> = kinds
                    .iter()
                    .map(|kind| match (rng.below(400) == 0, kind) {
                        (true, _) => rng.pick(&odd),
                        (false, I) => rng.pick(&integers),
                        (false, D) => rng.pick(&decimals),
                        (false, S) => rng.pick(&texts),
                    })
                    .collect();
                text += &line.join(",");
                text += ["\n", "\r\n", "\n\n"][rng.below(3)];
            }
            if rng.below(4) == 0 {
                text.pop();
            }
            let buf = text.as_bytes();
            let portable = read_lines_with::<Bytes>(buf, &kinds);
            #[cfg(target_arch = "x86_64")]
            assert!(read_lines_with::<Sse2>(buf, &kinds) == portable, "SSE2 differs on {text:?}");
            assert!(read_lines(buf, &kinds) == portable, "read_lines differs on {text:?}");
            if portable.is_some() { read += 1 } else { refused += 1 }
        }
        assert!(read > 1000 && refused > 100, "{read} blocks read, {refused} refused");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn pdep_is_fast_on_this_machine_when_it_is_not_old_amd() {
        // The vendor string read back from the words pdep_is_fast compares.
        let v = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [v.ebx, v.edx, v.ecx].iter().flat_map(|w| w.to_le_bytes()).collect();
        let family = (std::arch::x86_64::__cpuid(1).eax >> 8) & 0xF;
        if vendor == b"GenuineIntel" {
            assert!(pdep_is_fast());
        } else if vendor == b"AuthenticAMD" && family == 0xF {
            let extended = (std::arch::x86_64::__cpuid(1).eax >> 20) & 0xFF;
            assert_eq!(pdep_is_fast(), 0xF + extended >= 0x19);
        }
    }

    #[test]
    fn two_halves_are_one_read() {
        let mut text = String::new();
        for i in 0..100_000u64 {
            text += &format!("{}.{:03},{},RD,{}\n", i * 7, i % 1000, i as i64 - 50_000, i * 3);
        }
        let kinds = [D, I, S, I];
        assert!(text.len() >= HALVES_FROM);
        let whole = read_lines(text.as_bytes(), &kinds).unwrap();
        assert_eq!(whole.rows(), 100_000);
        assert!(read_lines_in_halves(text.as_bytes(), &kinds) == Some(whole), "the halves differ");
        text.replace_range(text.len() - 10.., "x,nan,RD,1\n");
        assert!(read_lines_in_halves(text.as_bytes(), &kinds).is_none());
    }
}

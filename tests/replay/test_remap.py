"""Remapping and alignment: every mapped I/O lies inside the target, aligned, covering its bytes."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from replay.remap import Mapping, apply, plan_mapping
from traces.errors import TargetError
from traces.schema import Op

GIB, MIB = 1 << 30, 1 << 20


@st.composite
def cases(draw, aligned=False):
    """(target_size, block_size, offset, length, op); target sizes need not be whole blocks."""
    bs = draw(st.sampled_from([512, 1024, 4096, 65536]))
    usable = bs * draw(st.one_of(st.integers(1, 64), st.integers(1, 1 << 40)))
    target_size = usable if aligned else usable + draw(st.integers(0, bs - 1))
    rows = draw(
        st.lists(
            st.tuples(
                st.one_of(st.integers(0, usable), st.integers(0, 1 << 62)),
                st.integers(1, usable),
                st.sampled_from(list(Op)),
            ),
            min_size=1,
            max_size=40,
        )
    )
    offset, length, op = (np.array(col) for col in zip(*rows))
    op = op.astype(np.uint8)
    flush = op == Op.FLUSH
    offset[flush], length[flush] = 0, 0
    if aligned:
        length = length // bs * bs
        length[(length == 0) & ~flush] = bs
        offset = offset % (usable - length + 1) // bs * bs
        offset[flush] = 0
    return target_size, bs, offset.astype(np.int64), length.astype(np.int64), op


def span_of(offset, length):
    return int((offset + length).max())


def unaligned(offset, length, io, bs):
    return int(np.count_nonzero(io & ((offset % bs != 0) | ((offset + length) % bs != 0))))


def reference_offset(mapping: Mapping, offset: int) -> int:
    """Where an I/O should land before alignment, in exact integer arithmetic."""
    if mapping.mode == "wrap":
        return offset % mapping.usable
    if mapping.mode == "scale":  # scales the block number, keeps the offset within the block
        bs = mapping.block_size
        return offset // bs * (mapping.usable // bs) // -(-mapping.span // bs) * bs + offset % bs
    return offset


@given(cases(), st.sampled_from(["wrap", "scale"]))
def test_mapped_ios_lie_inside_the_target_aligned_and_cover_their_bytes(case, mode):
    target_size, bs, offset, length, op = case
    mapping = plan_mapping(span_of(offset, length), int(length.max()), target_size, bs, mode)
    new_offset, new_length, n_aligned = apply(mapping, offset, length, op)

    assert new_offset.dtype == new_length.dtype == np.int64
    io = op != Op.FLUSH
    off, ln = new_offset[io], new_length[io]
    assert (off >= 0).all() and (off + ln <= target_size).all()
    assert (off % bs == 0).all() and (ln % bs == 0).all()
    assert (ln >= length[io]).all()
    # scale goes through float64; allow its rounding, at most one block.
    slack = bs if mapping.mode == "scale" else 0
    rows = zip(offset[io].tolist(), length[io].tolist(), off.tolist(), ln.tolist())
    for o, l, new_o, new_l in rows:
        want = reference_offset(mapping, o)
        clamped = new_o + new_l == mapping.usable
        assert clamped or (new_o <= want + slack and want + l <= new_o + new_l + slack)
    # Both modes move whole blocks, so alignment changes exactly the I/Os it would change in place.
    assert n_aligned == unaligned(offset, length, io, bs)
    assert (new_offset[~io] == offset[~io]).all() and (new_length[~io] == length[~io]).all()


@given(cases())
def test_fail_mode_refuses_exactly_when_the_span_exceeds_the_target(case):
    target_size, bs, offset, length, op = case
    span = span_of(offset, length)
    if span > target_size:
        with pytest.raises(TargetError, match="use a larger target or --remap wrap|scale"):
            plan_mapping(span, int(length.max()), target_size, bs, "fail")
    else:
        mapping = plan_mapping(span, int(length.max()), target_size, bs, "fail")
        new_offset, new_length, n_aligned = apply(mapping, offset, length, op)
        io = op != Op.FLUSH
        assert (new_offset[io] + new_length[io] <= target_size).all()
        assert n_aligned == unaligned(offset, length, io, bs)


@given(cases(aligned=True), st.sampled_from(["fail", "wrap", "scale"]))
def test_an_aligned_trace_that_fits_is_unchanged(case, mode):
    target_size, bs, offset, length, op = case
    mapping = plan_mapping(span_of(offset, length), int(length.max()), target_size, bs, mode)
    new_offset, new_length, n_aligned = apply(mapping, offset, length, op)
    assert mapping.mode == "identity"
    assert new_offset.tolist() == offset.tolist() and new_length.tolist() == length.tolist()
    assert n_aligned == 0


def test_fail_message_names_the_target_and_both_sizes():
    with pytest.raises(TargetError) as err:
        plan_mapping(GIB, 4096, 512 * MIB, 512, "fail", target_path="/dev/loop3")
    assert str(err.value) == (
        "the trace spans 1.0 GiB (1073741824 bytes) but /dev/loop3 holds 512.0 MiB "
        "(536870912 bytes); use a larger target or --remap wrap|scale"
    )


@pytest.mark.parametrize("mode", ["fail", "wrap", "scale"])
def test_an_io_longer_than_the_target_is_always_an_error(mode):
    with pytest.raises(TargetError, match="no remapping can fit it"):
        plan_mapping(GIB, 2 * MIB, MIB, 512, mode, target_path="small.img")


def test_an_io_that_only_fits_unaligned_is_an_error():
    # A 1500-byte file holds 1024 bytes of whole 512-byte blocks: a 1000-byte I/O rounds up
    # to 1024 and fits; an 1100-byte one rounds up to 1536 and cannot.
    plan_mapping(1000, 1000, 1500, 512, "fail")
    with pytest.raises(TargetError, match="in whole 512-byte blocks"):
        plan_mapping(1100, 1100, 1500, 512, "fail")


def test_unknown_mode_is_refused():
    with pytest.raises(TargetError, match="fail, wrap, scale"):
        plan_mapping(GIB, 4096, MIB, 512, "squeeze")


def test_scale_and_wrap_examples():
    offset = np.array([0, GIB, 2 * GIB - 4096, 100], dtype=np.int64)
    length = np.array([4096, 4096, 4096, 100], dtype=np.uint32)
    op = np.array([Op.READ, Op.WRITE, Op.READ, Op.READ], dtype=np.uint8)
    scale = plan_mapping(2 * GIB, 4096, GIB, 4096, "scale")
    new_offset, new_length, n_aligned = apply(scale, offset, length, op)
    assert new_offset.tolist() == [0, GIB // 2, GIB - 4096, 0]
    assert new_length.tolist() == [4096, 4096, 4096, 4096]
    assert n_aligned == 1
    wrap = plan_mapping(2 * GIB, 4096, GIB, 4096, "wrap")
    new_offset, new_length, n_aligned = apply(wrap, offset, length, op)
    assert new_offset.tolist() == [0, 0, GIB - 4096, 0]
    assert n_aligned == 1


def test_alignment_clamps_at_the_end_and_leaves_flushes_and_inputs_alone():
    mapping = plan_mapping(4096, 4096, 4096, 4096, "fail")
    offset = np.array([10, 0, 4095], dtype=np.int64)
    length = np.array([4000, 0, 1], dtype=np.int64)
    op = np.array([Op.WRITE, Op.FLUSH, Op.DISCARD], dtype=np.uint8)
    new_offset, new_length, n_aligned = apply(mapping, offset, length, op)
    assert new_offset.tolist() == [0, 0, 0]
    assert new_length.tolist() == [4096, 0, 4096]
    assert n_aligned == 2
    assert offset.tolist() == [10, 0, 4095] and length.tolist() == [4000, 0, 1]


def test_a_straddling_io_as_long_as_the_target_is_trimmed_to_it():
    # A 9000-byte file has 8192 bytes of whole blocks; bytes 100..8292 round out to 0..12288.
    mapping = plan_mapping(8292, 8192, 9000, 4096, "fail")
    new_offset, new_length, n_aligned = apply(
        mapping, np.array([100]), np.array([8192]), np.array([Op.READ])
    )
    assert new_offset.tolist() == [0] and new_length.tolist() == [8192]
    assert n_aligned == 1

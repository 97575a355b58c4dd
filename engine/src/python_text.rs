//! The Python side of `text`: `read_lines(block, kinds)`, the fast reader behind
//! traces.formats.reading.fast_lines. The block crosses once, as a buffer; the GIL is
//! released while it is read.

use numpy::IntoPyArray;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::text::{read_lines_in_halves, Column, Kind};

/// The kind of a field by the Arrow type name of its column ("int64", "float64"), or None
/// for a field that is not kept.
fn kind_of(name: Option<&str>) -> PyResult<Kind> {
    match name {
        None => Ok(Kind::Skip),
        Some("int64") => Ok(Kind::Integer),
        Some("float64") => Ok(Kind::Decimal),
        Some(other) => Err(PyValueError::new_err(format!(
            "read_lines reads int64 and float64 columns, not {other}"
        ))),
    }
}

/// read_lines(block, kinds) -> (columns, LFs read) or None
///
/// The comma-separated lines of `block` (a contiguous bytes-like object of whole lines), one
/// field each in `kinds`: "int64" (an optional minus and 1-18 digits), "float64" (1-15 digits,
/// then optionally a point and 1-3 digits) or None (not kept: any text but a comma, CR or LF).
/// `columns` are the kept fields' NumPy arrays, in field order. None when a line is anything
/// else (another field count, a space, an exponent, "nan", a lone CR...), for pyarrow to read.
#[pyfunction]
fn read_lines<'py>(
    py: Python<'py>,
    block: &Bound<'py, PyAny>,
    kinds: Vec<Option<String>>,
) -> PyResult<Option<(Vec<Bound<'py, PyAny>>, u64)>> {
    let kinds = kinds.iter().map(|k| kind_of(k.as_deref())).collect::<PyResult<Vec<_>>>()?;
    let buffer = PyBuffer::<u8>::get(block)?;
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err("read_lines needs a contiguous buffer"));
    }
    let bytes: &[u8] = if buffer.len_bytes() == 0 {
        &[]
    } else {
        // SAFETY: the buffer is contiguous and `buffer` keeps it exported (a bytearray cannot
        // be resized while exported) until it drops, after the last use of `bytes`; the caller
        // (read_blocks) does not write the block while it is read.
        unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) }
    };
    let Some(lines) = py.detach(|| read_lines_in_halves(bytes, &kinds)) else {
        return Ok(None);
    };
    let columns = lines
        .columns
        .into_iter()
        .map(|c| match c {
            Column::Integer(v) => v.into_pyarray(py).into_any(),
            Column::Decimal(v) => v.into_pyarray(py).into_any(),
        })
        .collect();
    Ok(Some((columns, lines.newlines)))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_lines, m)?)
}

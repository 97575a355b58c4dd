//! tracereplay's native async I/O core: engines (io_uring, psync, null) behind one small
//! trait, a core loop that paces and accounts, and a thin Python module over it.

pub mod backend;
pub mod causal;
pub mod clock;
pub mod data;
pub mod null;
pub mod pool;
pub mod psync;
pub mod run;
pub mod text;
pub mod uring;

#[cfg(feature = "python")]
mod python;
#[cfg(feature = "python")]
mod python_text;

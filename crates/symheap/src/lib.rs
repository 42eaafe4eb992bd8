//! symheap: symmetric memory across GPUs and CPU processes.
pub mod bootstrap;
pub mod config;
pub mod error;

pub use error::{Error, ErrorKind, Result};

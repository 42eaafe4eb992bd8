//! What the one-PE integration tests share.

use symheap::{BackendChoice, Context};

/// A one-PE job on the host backend.
pub fn host_pe() -> Context {
    Context::builder()
        .unwrap()
        .backend(BackendChoice::Host)
        .init()
        .unwrap()
}

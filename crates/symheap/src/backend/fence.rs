//! What a released block waits for before its memory is reused: its own file, below both the
//! backends that make fences and the heap that waits on them.

/// Device work a released block may still be used by: `done` says, without waiting, whether
/// it has finished (see `Inner::release_block`).
pub trait Fence: Send {
    /// True once every piece of work the fence stands for has finished.
    fn done(&mut self) -> bool;
}

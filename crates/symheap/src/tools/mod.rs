//! **Not part of symheap's public API**: what the `symheap` command (crate `symheap-cli`) needs
//! beyond the public API to check and measure the runtime, and may change in any release.
//!
//! The command's self-test scenarios and benchmarks time work with driver events, capture CUDA
//! graphs, compare symheap with a plain peer copy and with NCCL over ordinary `cuMemAlloc`
//! buffers. They reach the driver and NCCL through the runtime's own layers
//! (`backend/cuda/driver` and `backend/cuda/nccl.rs`): one driver layer and one NCCL binding
//! in the process, so the command loads the same `libnccl.so.2` the runtime would, found the
//! same way (`SYMHEAP_NCCL_LIB`, the `nvidia-nccl-cu13` wheel, the loader).
//!
//! It is a hidden module rather than a cargo feature so that one build of the runtime serves
//! both the Python extension and the command (a feature would compile the runtime twice for
//! every wheel); the extension references nothing here, so its link drops all of it.

mod nccl;

pub use crate::backend::cuda::driver::measure::{
    DeviceBuffer, DeviceMem, Event, ForeignStream, Graph, PeerCopy,
};
pub use nccl::{nccl_version_string, Nccl};

// SAFETY: a live symmetric allocation of `len_bytes()` bytes, released only when dropped.
unsafe impl DeviceMem for crate::SymmetricBuffer {
    fn addr(&self) -> u64 {
        crate::SymmetricBuffer::addr(self)
    }
    fn len_bytes(&self) -> u64 {
        crate::SymmetricBuffer::len_bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceMem;

    struct Span(u64);
    // SAFETY: never handed to the driver; only `span`'s arithmetic is tested.
    unsafe impl DeviceMem for Span {
        fn addr(&self) -> u64 {
            0x1000
        }
        fn len_bytes(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn a_span_past_the_buffer_is_refused_before_any_driver_call() {
        assert_eq!(Span(64).span(64, "x").ok(), Some(0x1000));
        let e = Span(64).span(65, "ncclAllGather").unwrap_err().to_string();
        assert!(
            e.contains("ncclAllGather: 65 bytes asked of a 64-byte buffer"),
            "{e}"
        );
    }
}

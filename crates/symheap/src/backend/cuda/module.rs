//! Users' own CUDA C++ modules, compiled by NVRTC against `symheap.cuh` for this device.

use super::driver::{self, Module};
use super::{cache, nvrtc, prebuilt, CudaBackend, KernelArg};
use crate::error::{err, invalid, ErrorKind, Result};
use crate::stream::Stream;

/// A module of user kernels compiled by NVRTC against `symheap.cuh` for this device.
pub struct CudaModule {
    module: Module,
    dev: usize,
    /// The context it was loaded into, which every launch's stream must belong to.
    ctx: u64,
}

impl CudaModule {
    /// Launches `kernel` with a 1-D grid on `stream`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and size, and every pointer
    /// argument must be valid for the accesses the kernel makes (device memory of this context,
    /// or symmetric addresses from a peer table). A wrong argument makes the kernel read or
    /// write arbitrary device memory.
    pub unsafe fn launch(
        &self,
        kernel: &str,
        grid: u32,
        block: u32,
        shared: u32,
        stream: &Stream,
        args: &[KernelArg],
    ) -> Result<()> {
        let f = self.module.function(kernel)?;
        let stream = stream.checked(self.ctx, "launch")?;
        // SAFETY: `args` match the kernel's parameters and their addresses are valid (this
        // function's contract); `stream` belongs to the module's context (checked above).
        unsafe { driver::launch(f, grid, block, shared, stream, args) }
    }

    /// The device ordinal it was compiled for.
    pub fn device(&self) -> usize {
        self.dev
    }
}

impl CudaBackend {
    /// Compiles user CUDA C++ (which may `#include "symheap.cuh"`) for this device, using the
    /// kernel cache, and loads it.
    pub fn compile_module(&self, source: &str, name: &str) -> Result<CudaModule> {
        self.bind()?;
        let arch = (self.dev.cc.0 * 10 + self.dev.cc.1) as u32;
        let (nv, _) =
            nvrtc::for_arch(arch).map_err(|m| err("compile_module", ErrorKind::Unsupported(m)))?;
        let hash = prebuilt::source_hash(&[nvrtc::HEADER, source]);
        let path = cache::path(hash, arch, self.driver_version, nv);
        let image = match cache::load(&path) {
            Some(i) => i,
            None => {
                let i = nvrtc::compile_cubin(source, name, arch, &[("symheap.cuh", nvrtc::HEADER)])
                    .map_err(|log| {
                        invalid(
                            "compile_module",
                            format!("{name} does not compile for sm_{arch}: {log}"),
                        )
                    })?;
                cache::store(&path, &i);
                i
            }
        };
        Ok(CudaModule {
            module: Module::load(&image)?,
            dev: self.dev.ordinal,
            ctx: self.dev.context_handle(),
        })
    }

    /// Creates a non-blocking stream of this device (for programs without a framework that
    /// owns streams); destroyed when the value is dropped.
    pub fn create_stream(&self) -> Result<Stream> {
        self.new_stream()
    }
}

//! symheap's own kernels: their programs as compiled (the sources with the argument layout
//! checks ahead of them), where their images come from (embedded at build time, the on-disk
//! cache or NVRTC), and loading them into modules as handles typed by their argument blocks.

use super::arg_block::{layout_header, Kernel};
use super::coll_args::{self, CollDType, CollKernels};
use super::driver::{Device, Module};
use super::kernel_args::{
    self, AtomicArgs, BarrierArgs, CopyArgs, OneKernel, PutSignalArgs, SignalArgs, WaitArgs,
};
use super::prebuilt::KernelImage;
use super::{cache, compat, nvrtc, prebuilt};
use crate::element::DType;
use crate::error::{err, ErrorKind, Result};

/// kernels.cu's kernels, each typed by its argument block.
pub(super) struct Kernels {
    pub(super) _module: Module,
    pub(super) copy: Kernel<CopyArgs>,
    pub(super) put_signal: Kernel<PutSignalArgs>,
    pub(super) signal: Kernel<SignalArgs>,
    pub(super) wait: Kernel<WaitArgs>,
    pub(super) barrier: Kernel<BarrierArgs>,
    pub(super) atomic: Kernel<AtomicArgs>,
    /// Where the cubin came from, for the banner.
    pub(super) origin: String,
}

/// Where a module's image came from, for the banner.
fn image_origin(arch: u32, nvrtc: (i32, i32), how: &str) -> String {
    format!("{how} sm_{arch} image (NVRTC {}.{})", nvrtc.0, nvrtc.1)
}

/// Loads one of symheap's kernel sources for `dev`: the image embedded at build time that this
/// driver loads, when there is one for this arch ([`prebuilt::candidates`]), else the on-disk
/// cache, else NVRTC (then cached); `choice` (`SYMHEAP_KERNEL_IMAGE`) narrows that. Returns the
/// module and where its image came from (for the banner).
pub(super) fn build(
    dev: &Device,
    driver_version: i32,
    choice: KernelImage,
    source: &str,
    name: &str,
) -> Result<(Module, String)> {
    let arch = (dev.cc.0 * 10 + dev.cc.1) as u32;
    let driver = compat::driver_cuda(driver_version);
    let hash = prebuilt::source_hash(&[nvrtc::HEADER, source]);
    let (images, mut passed) = prebuilt::candidates(prebuilt::PREBUILT, hash, arch, driver, choice);
    for img in images {
        match Module::load(img.bytes) {
            Ok(m) => return Ok((m, image_origin(img.arch, img.nvrtc, "prebuilt"))),
            // The driver may lack minor version compatibility: try the next, then NVRTC.
            Err(e) => passed.push(format!(
                "the sm_{} image built by NVRTC {}.{} did not load: {e}",
                img.arch, img.nvrtc.0, img.nvrtc.1
            )),
        }
    }
    let unsupported = |m: String| err("init", ErrorKind::Unsupported(m));
    let why_not_prebuilt = || {
        let shipped: Vec<String> = prebuilt::images()
            .iter()
            .map(|(a, v)| format!("sm_{a} (NVRTC {}.{})", v.0, v.1))
            .collect();
        let mut have = if shipped.is_empty() {
            "this build carries no prebuilt kernels".to_string()
        } else {
            format!(
                "this build carries prebuilt kernels for {}",
                shipped.join(", ")
            )
        };
        if !passed.is_empty() {
            have.push_str(&format!("; {}", passed.join("; ")));
        }
        format!(
            "{} is sm_{arch} on a CUDA {}.{} driver and {have}",
            dev.name, driver.0, driver.1
        )
    };
    if choice.prebuilt_only() {
        return Err(unsupported(format!(
            "SYMHEAP_KERNEL_IMAGE={} allows only an embedded image for {name}, and none loads: {}",
            choice.name(),
            why_not_prebuilt()
        )));
    }
    let (nv, _) = nvrtc::for_arch(arch).map_err(|m| {
        unsupported(format!(
            "{}, so NVRTC must compile {name}: {m}",
            why_not_prebuilt()
        ))
    })?;
    let path = cache::path(hash, arch, driver_version, nv);
    let (image, origin) = match cache::load(&path) {
        Some(img) => (img, image_origin(arch, nv, "cached")),
        None => {
            let (img, used) = nvrtc::compile_cubin_with_version(
                source,
                name,
                arch,
                &[(nvrtc::HEADER_NAME, nvrtc::HEADER)],
            )
            .map_err(|log| {
                unsupported(format!(
                    "NVRTC {}.{} cannot compile {name} for sm_{arch} ({}): {log}",
                    nv.0, nv.1, dev.name
                ))
            })?;
            // Filed under the NVRTC that compiled it (the same one, short of a concurrent
            // change of SYMHEAP_NVRTC).
            cache::store(&cache::path(hash, arch, driver_version, used), &img);
            (img, image_origin(arch, used, "compiled"))
        }
    };
    let module = Module::load(&image).map_err(|e| {
        unsupported(format!(
            "the driver (CUDA {}.{}) cannot load {name} as built for sm_{arch}: {e}",
            driver.0, driver.1
        ))
    })?;
    Ok((module, origin))
}

/// Compiles `source` (one of [`shipped_sources`], named `name`) for `arch` with the NVRTC chosen
/// here, for a build that embeds it; returns the file name `build.rs` reads it back by (which
/// records that NVRTC's version) and the cubin. `Err` carries the NVRTC log.
pub fn compile_shipped(
    source: &str,
    name: &str,
    arch: u32,
) -> std::result::Result<(String, Vec<u8>), String> {
    let (image, nv) = nvrtc::compile_cubin_with_version(
        source,
        name,
        arch,
        &[(nvrtc::HEADER_NAME, nvrtc::HEADER)],
    )?;
    let hash = prebuilt::source_hash(&[nvrtc::HEADER, source]);
    Ok((prebuilt::file_name(hash, arch, nv), image))
}

/// The program name of kernels.cu (in messages, and in [`shipped_sources`]).
const KERNELS_PROGRAM: &str = "symheap_kernels.cu";
/// The program name of coll.cu.
const COLL_PROGRAM: &str = "symheap_coll.cu";

/// symheap's own kernel sources as the backend compiles them with no tuning overrides: (program
/// name, source). `symheap kernels` compiles these ahead of time for the wheel.
pub fn shipped_sources() -> Vec<(&'static str, String)> {
    vec![
        (KERNELS_PROGRAM, kernels_source()),
        (COLL_PROGRAM, coll_source(&[])),
    ]
}

/// One kernel of symheap's programs: its program (as named in [`shipped_sources`]), its symbol
/// and the size of the argument block it takes as its one parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelEntry {
    /// The program's name.
    pub program: &'static str,
    /// The `extern "C"` symbol.
    pub symbol: String,
    /// Bytes of its argument block.
    pub arg_bytes: usize,
}

/// Every kernel the backend launches, for checks of the compiled programs.
pub fn kernel_entries() -> Vec<KernelEntry> {
    let own = kernel_args::symbols()
        .into_iter()
        .map(|(symbol, arg_bytes)| KernelEntry {
            program: KERNELS_PROGRAM,
            symbol: symbol.to_string(),
            arg_bytes,
        });
    let coll = coll_args::symbols()
        .into_iter()
        .map(|(symbol, arg_bytes)| KernelEntry {
            program: COLL_PROGRAM,
            symbol,
            arg_bytes,
        });
    own.chain(coll).collect()
}

/// kernels.cu as compiled: its argument layout checks, then the source.
pub fn kernels_source() -> String {
    let mut src = layout_header(&kernel_args::blocks());
    src.push_str(nvrtc::KERNELS);
    src
}

/// The file name under which the image of `source` (from [`shipped_sources`]) for `arch`, built
/// by NVRTC `nvrtc`, is embedded by a build with `SYMHEAP_PREBUILT_KERNELS`.
pub fn prebuilt_file_name(source: &str, arch: u32, nvrtc: (i32, i32)) -> String {
    prebuilt::file_name(prebuilt::source_hash(&[nvrtc::HEADER, source]), arch, nvrtc)
}

/// The architectures this build carries prebuilt kernels for.
pub fn prebuilt_archs() -> Vec<u32> {
    prebuilt::archs()
}

/// The (arch, version of the NVRTC that built it) of every kernel image this build carries.
pub fn prebuilt_images() -> Vec<(u32, (i32, i32))> {
    prebuilt::images()
}

/// Dtypes the reducing kernels are built for, with their symbol suffix.
pub const COLL_DTYPES: &[(DType, &str)] = &[
    (DType::F32, "f32"),
    (DType::F16, "f16"),
    (DType::BF16, "bf16"),
    (DType::I32, "i32"),
];

/// Whether the GPU reduction kernels handle `d`.
pub fn coll_supports(d: DType) -> bool {
    CollDType::of(d).is_some()
}

/// The collective kernels' program: `defines` (already validated: `SYMHEAP_COLL_*` names,
/// integer values; they change the cache key with the source), the argument layout checks, then
/// the source.
pub fn coll_source(defines: &[(String, u64)]) -> String {
    let mut src = String::new();
    for (name, value) in defines {
        // A plain decimal literal: it takes the smallest integer type that holds it, so it also
        // fits `int` template arguments (an `ull` suffix would be a narrowing conversion there).
        src.push_str(&format!("#define {name} {value}\n"));
    }
    src.push_str(&layout_header(&coll_args::blocks()));
    src.push_str(nvrtc::COLL);
    src
}

pub(super) fn compile_coll(
    dev: &Device,
    driver_version: i32,
    choice: KernelImage,
    defines: &[(String, u64)],
) -> Result<CollKernels> {
    let source = coll_source(defines);
    let (module, _) = build(dev, driver_version, choice, &source, COLL_PROGRAM)?;
    CollKernels::load(module)
}

/// kernels.cu's kernel for block `A`.
fn one<A: OneKernel>(module: &Module) -> Result<Kernel<A>> {
    // SAFETY: `A::SYMBOL` takes `A`'s C struct by value (kernels.cu; the program's layout checks
    // and nvrtc_compile's `every_kernel_takes_its_argument_block`); the module is kept alongside.
    unsafe { Kernel::load(module, A::SYMBOL) }
}

pub(super) fn compile_kernels(
    dev: &Device,
    driver_version: i32,
    choice: KernelImage,
) -> Result<Kernels> {
    let (module, origin) = build(
        dev,
        driver_version,
        choice,
        &kernels_source(),
        KERNELS_PROGRAM,
    )?;
    Ok(Kernels {
        copy: one(&module)?,
        put_signal: one(&module)?,
        signal: one(&module)?,
        wait: one(&module)?,
        barrier: one(&module)?,
        atomic: one(&module)?,
        _module: module,
        origin,
    })
}

#[cfg(test)]
mod coll_source_tests {
    use super::*;

    #[test]
    fn defines_go_ahead_of_the_kernels() {
        let src = coll_source(&[
            ("SYMHEAP_COLL_LL_MAX".to_string(), 128 << 10),
            ("SYMHEAP_COLL_BCAST_PUSH".to_string(), 0),
        ]);
        assert!(src.starts_with(
            "#define SYMHEAP_COLL_LL_MAX 131072\n#define SYMHEAP_COLL_BCAST_PUSH 0\n"
        ));
        assert!(src.ends_with(nvrtc::COLL));
        let plain = coll_source(&[]);
        assert!(plain.starts_with("// Generated by symheap"), "{plain:.200}");
        assert!(plain.contains("#define SYMHEAP_ARG_LAYOUT \\\n"));
        assert!(plain.ends_with(nvrtc::COLL));
        assert!(src.ends_with(&plain));
    }

    #[test]
    fn coll_dtypes_are_the_reducing_kernels_types() {
        let table: Vec<(DType, &str)> = CollDType::ALL
            .iter()
            .map(|d| (d.dtype(), d.suffix()))
            .collect();
        assert_eq!(COLL_DTYPES, table.as_slice());
        assert!(coll_supports(DType::BF16) && !coll_supports(DType::F64));
    }

    #[test]
    fn every_kernel_is_listed_once() {
        let entries = kernel_entries();
        assert_eq!(entries.len(), 6 + 5 * 4 + 7);
        let mut symbols: Vec<&str> = entries.iter().map(|e| e.symbol.as_str()).collect();
        symbols.sort_unstable();
        symbols.dedup();
        assert_eq!(symbols.len(), entries.len());
        let programs: Vec<&str> = shipped_sources().iter().map(|(p, _)| *p).collect();
        assert!(entries.iter().all(|e| programs.contains(&e.program)));
    }
}

//! symheap's own kernels: where their images come from (embedded at build time, the on-disk
//! cache or NVRTC), the collective kernels' names and dtypes, and loading them into modules.

use std::collections::HashMap;

use super::driver::{Device, Function, Module};
use super::{cache, nvrtc, prebuilt};
use crate::element::DType;
use crate::error::{err, ErrorKind, Result};

pub(super) struct Kernels {
    pub(super) _module: Module,
    pub(super) copy: Function,
    pub(super) put_signal: Function,
    pub(super) signal: Function,
    pub(super) wait: Function,
    pub(super) barrier: Function,
    pub(super) atomic: Function,
    /// Where the cubin came from, for the banner.
    pub(super) origin: String,
}

/// Loads one of symheap's kernel sources for `dev`: the image embedded at build time when there
/// is one for this arch ([`prebuilt`]), else the on-disk cache, else NVRTC (then cached).
/// Returns the module and where its image came from (for the banner).
pub(super) fn build(
    dev: &Device,
    driver_version: i32,
    source: &str,
    name: &str,
) -> Result<(Module, String)> {
    let arch = (dev.cc.0 * 10 + dev.cc.1) as u32;
    let hash = prebuilt::source_hash(&[nvrtc::HEADER, source]);
    let mut skipped = String::new();
    if let Some((image_arch, image)) = prebuilt::find(hash, arch) {
        match Module::load(image) {
            Ok(m) => return Ok((m, format!("prebuilt for sm_{image_arch}"))),
            // A driver older than the NVRTC that built the image: compile here instead.
            Err(e) => skipped = format!("; the prebuilt sm_{image_arch} image did not load: {e}"),
        }
    }
    let nv = nvrtc::version().map_err(|m| {
        let shipped = prebuilt::archs();
        let have = if shipped.is_empty() {
            "this build carries no prebuilt kernels".to_string()
        } else {
            let list: Vec<String> = shipped.iter().map(|a| format!("sm_{a}")).collect();
            format!(
                "this build carries prebuilt kernels for {}",
                list.join(", ")
            )
        };
        err(
            "init",
            ErrorKind::Unsupported(format!(
                "{} is sm_{arch} and {have}{skipped}, so NVRTC must compile {name}: {m}",
                dev.name
            )),
        )
    })?;
    let path = cache::path(hash, arch, driver_version, nv);
    let (image, origin) = match cache::load(&path) {
        Some(img) => (img, format!("cached {}", path.display())),
        None => {
            let img = nvrtc::compile_cubin(source, name, arch, &[("symheap.cuh", nvrtc::HEADER)])
                .map_err(|log| {
                err(
                    "init",
                    ErrorKind::Unsupported(format!(
                        "NVRTC {}.{} cannot compile {name} for sm_{arch} ({}): {log}",
                        nv.0, nv.1, dev.name
                    )),
                )
            })?;
            cache::store(&path, &img);
            (
                img,
                format!("compiled by NVRTC {}.{} for sm_{arch}", nv.0, nv.1),
            )
        }
    };
    let module = Module::load(&image).map_err(|e| {
        err(
            "init",
            ErrorKind::Unsupported(format!(
                "the driver ({driver_version}) cannot load kernels built for sm_{arch}: {e}"
            )),
        )
    })?;
    Ok((module, origin))
}

/// symheap's own kernel sources as the backend compiles them with no tuning overrides: (program
/// name, source). `symheap kernels` compiles these ahead of time for the wheel.
pub fn shipped_sources() -> Vec<(&'static str, String)> {
    vec![
        ("symheap_kernels.cu", nvrtc::KERNELS.to_string()),
        ("symheap_coll.cu", coll_source(&[])),
    ]
}

/// The file name under which the image of `source` (from [`shipped_sources`]) for `arch` is
/// embedded by a build with `SYMHEAP_PREBUILT_KERNELS`.
pub fn prebuilt_file_name(source: &str, arch: u32) -> String {
    prebuilt::file_name(prebuilt::source_hash(&[nvrtc::HEADER, source]), arch)
}

/// The architectures this build carries prebuilt kernels for.
pub fn prebuilt_archs() -> Vec<u32> {
    prebuilt::archs()
}

/// Names of the collective kernels (coll.cu), looked up once at init.
const COLL_KERNELS: &[&str] = &[
    "symheap_allgather",
    "symheap_broadcast",
    "symheap_alltoall",
    "symheap_exchange_ll",
    "symheap_exchange_ll128",
    "symheap_alltoallv",
    "symheap_team_barrier",
];
/// Reduction kernels exist per dtype suffix.
const COLL_REDUCING: &[&str] = &[
    "symheap_ar_oneshot",
    "symheap_ar_flag",
    "symheap_ar_ll128",
    "symheap_ar_twoshot",
    "symheap_reduce_scatter",
];
/// Dtypes the reducing kernels are built for.
pub const COLL_DTYPES: &[(DType, &str)] = &[
    (DType::F32, "f32"),
    (DType::F16, "f16"),
    (DType::BF16, "bf16"),
    (DType::I32, "i32"),
];

/// Whether the GPU reduction kernels handle `d`.
pub fn coll_supports(d: DType) -> bool {
    COLL_DTYPES.iter().any(|(t, _)| *t == d)
}

pub(super) struct CollKernels {
    pub(super) _module: Module,
    pub(super) fns: HashMap<String, Function>,
}

/// The collective kernels' source with `defines` (already validated: `SYMHEAP_COLL_*` names,
/// integer values) ahead of it; they change the cache key with the source.
pub(super) fn coll_source(defines: &[(String, u64)]) -> String {
    let mut src = String::new();
    for (name, value) in defines {
        // A plain decimal literal: it takes the smallest integer type that holds it, so it also
        // fits `int` template arguments (an `ull` suffix would be a narrowing conversion there).
        src.push_str(&format!("#define {name} {value}\n"));
    }
    src.push_str(nvrtc::COLL);
    src
}

pub(super) fn compile_coll(
    dev: &Device,
    driver_version: i32,
    defines: &[(String, u64)],
) -> Result<CollKernels> {
    let source = coll_source(defines);
    let (module, _) = build(dev, driver_version, &source, "symheap_coll.cu")?;
    let mut fns = HashMap::new();
    for k in COLL_KERNELS {
        fns.insert(k.to_string(), module.function(k)?);
    }
    for k in COLL_REDUCING {
        for (_, sfx) in COLL_DTYPES {
            let name = format!("{k}_{sfx}");
            let f = module.function(&name)?;
            fns.insert(name, f);
        }
    }
    Ok(CollKernels {
        _module: module,
        fns,
    })
}

pub(super) fn compile_kernels(dev: &Device, driver_version: i32) -> Result<Kernels> {
    let (module, origin) = build(dev, driver_version, nvrtc::KERNELS, "symheap_kernels.cu")?;
    Ok(Kernels {
        copy: module.function("symheap_copy")?,
        put_signal: module.function("symheap_put_signal")?,
        signal: module.function("symheap_signal")?,
        wait: module.function("symheap_wait")?,
        barrier: module.function("symheap_barrier")?,
        atomic: module.function("symheap_atomic")?,
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
        assert_eq!(coll_source(&[]), nvrtc::COLL);
    }
}

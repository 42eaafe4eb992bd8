// The file names of prebuilt kernel images, shared by the library (`prebuilt.rs`) and its build
// script (`build.rs`, which `include!`s this file), so both read one format.

/// The file an image is written under by `symheap kernels` and read back from by `build.rs`:
/// `kernels-<source hash, 16 hex>-sm<arch>-nvrtc<major>.<minor>.cubin`, the NVRTC version being
/// the one that built it (the oldest CUDA driver that loads it directly).
pub fn file_name(hash: u64, arch: u32, nvrtc: (i32, i32)) -> String {
    format!(
        "kernels-{hash:016x}-sm{arch}-nvrtc{}.{}.cubin",
        nvrtc.0, nvrtc.1
    )
}

/// The (hash, arch, NVRTC version) of a [`file_name`], or `None` for any other name.
pub fn parse_file_name(name: &str) -> Option<(u64, u32, (i32, i32))> {
    let rest = name.strip_prefix("kernels-")?.strip_suffix(".cubin")?;
    let (hash, rest) = rest.split_once("-sm")?;
    let (arch, nvrtc) = rest.split_once("-nvrtc")?;
    let (major, minor) = nvrtc.split_once('.')?;
    if hash.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(hash, 16).ok()?,
        arch.parse().ok()?,
        (major.parse().ok()?, minor.parse().ok()?),
    ))
}

//! Embeds kernels compiled ahead of time, when the build is given them.
//!
//! `SYMHEAP_PREBUILT_KERNELS=DIR` names a folder of `kernels-<hash>-sm<arch>-nvrtc<M>.<m>.cubin`
//! files made by `symheap kernels --out DIR` (NVRTC, no GPU needed); the wheel and release builds
//! set it (scripts/build_wheel.sh). The library then loads those images at init instead of
//! running NVRTC, each only on a driver that can load what its NVRTC version built. Unset,
//! nothing is embedded and every kernel is compiled at run time as before.

use std::fmt::Write as _;
use std::path::PathBuf;

/// The file name format, shared with the library.
#[allow(dead_code)] // `file_name` is the library's half
mod name {
    include!("src/backend/cuda/prebuilt_name.rs");
}
use name::parse_file_name;

fn main() {
    println!("cargo:rerun-if-env-changed=SYMHEAP_PREBUILT_KERNELS");
    println!("cargo:rerun-if-changed=src/backend/cuda/prebuilt_name.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut code = String::from(
        "/// Kernel images compiled ahead of time (see `build.rs`).\n\
         pub(crate) static PREBUILT: &[Image] = &[\n",
    );
    if let Some(dir) = std::env::var_os("SYMHEAP_PREBUILT_KERNELS").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
            panic!("SYMHEAP_PREBUILT_KERNELS={}: {e}", dir.display());
        });
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for path in files {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if !name.starts_with("kernels-") {
                continue;
            }
            // An image without its NVRTC version could be handed to a driver that cannot load
            // it: a folder from an older `symheap kernels` is refused, not half used.
            let (hash, arch, (major, minor)) = parse_file_name(name).unwrap_or_else(|| {
                panic!(
                    "SYMHEAP_PREBUILT_KERNELS: {} is not named \
                     kernels-<hash>-sm<arch>-nvrtc<major>.<minor>.cubin; remake the folder \
                     with this checkout's `symheap kernels`",
                    path.display()
                )
            });
            let abs = std::fs::canonicalize(&path).expect("a listed file exists");
            println!("cargo:rerun-if-changed={}", abs.display());
            writeln!(
                code,
                "    Image {{ hash: {hash:#018x}, arch: {arch}, nvrtc: ({major}, {minor}), \
                 bytes: include_bytes!({abs:?}) }},"
            )
            .expect("writing to a String");
        }
    }
    code.push_str("];\n");
    std::fs::write(out.join("prebuilt.rs"), code).expect("writing OUT_DIR/prebuilt.rs");
}

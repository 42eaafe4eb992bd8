//! Embeds kernels compiled ahead of time, when the build is given them.
//!
//! `SYMHEAP_PREBUILT_KERNELS=DIR` names a folder of `kernels-<hash>-sm<arch>.cubin` files made by
//! `symheap kernels --out DIR` (NVRTC, no GPU needed); the wheel and release builds set it
//! (scripts/build_wheel.sh). The library then loads those images at init instead of running
//! NVRTC. Unset, nothing is embedded and every kernel is compiled at run time as before.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=SYMHEAP_PREBUILT_KERNELS");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut code = String::from(
        "/// Kernel images compiled ahead of time: (source hash, sm arch, cubin).\n\
         pub(crate) static PREBUILT: &[(u64, u32, &[u8])] = &[\n",
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
            let Some((hash, arch)) = parse(name) else {
                continue;
            };
            let abs = std::fs::canonicalize(&path).expect("a listed file exists");
            println!("cargo:rerun-if-changed={}", abs.display());
            writeln!(code, "    ({hash:#018x}, {arch}, include_bytes!({abs:?})),")
                .expect("writing to a String");
        }
    }
    code.push_str("];\n");
    std::fs::write(out.join("prebuilt.rs"), code).expect("writing OUT_DIR/prebuilt.rs");
}

/// `kernels-<16 hex>-sm<arch>.cubin` -> (hash, arch).
fn parse(name: &str) -> Option<(u64, u32)> {
    let rest = name.strip_prefix("kernels-")?.strip_suffix(".cubin")?;
    let (hash, arch) = rest.split_once("-sm")?;
    if hash.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(hash, 16).ok()?, arch.parse().ok()?))
}

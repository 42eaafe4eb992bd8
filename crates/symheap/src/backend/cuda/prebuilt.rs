//! symheap's own kernels compiled ahead of time for the common architectures and embedded in
//! the library (see `build.rs`), so a first init loads them directly: no NVRTC, no compile.
//! NVRTC still runs for other architectures, for tuning overrides (`SYMHEAP_COLL_DEFINES`
//! changes the source, so its hash matches nothing here) and for users' own modules.

use crate::util::fnv1a;

include!(concat!(env!("OUT_DIR"), "/prebuilt.rs"));

/// The hash an image is filed under: FNV-1a over the sources, each followed by a NUL (the
/// same key the on-disk cache uses, so a prebuilt image is exactly what NVRTC would build).
pub(crate) fn source_hash(sources: &[&str]) -> u64 {
    let mut bytes = Vec::new();
    for s in sources {
        bytes.extend_from_slice(s.as_bytes());
        bytes.push(0);
    }
    fnv1a(&bytes)
}

/// The file name `symheap kernels` writes an image under and `build.rs` reads it back from.
pub fn file_name(hash: u64, arch: u32) -> String {
    format!("kernels-{hash:016x}-sm{arch}.cubin")
}

/// The embedded image for sources with `hash` that runs on `arch` (e.g. 86): the exact arch,
/// else the newest of the same major version not newer than it (a cubin runs on later minor
/// versions of its major: sm_80 code on sm_86 and sm_89). Returns the image's own arch too.
pub(crate) fn find(hash: u64, arch: u32) -> Option<(u32, &'static [u8])> {
    PREBUILT
        .iter()
        .filter(|(h, a, _)| *h == hash && *a / 10 == arch / 10 && *a <= arch)
        .max_by_key(|(_, a, _)| *a)
        .map(|(_, a, img)| (*a, *img))
}

/// The architectures this build carries prebuilt kernels for (empty for a plain `cargo build`).
pub fn archs() -> Vec<u32> {
    let mut a: Vec<u32> = PREBUILT.iter().map(|(_, a, _)| *a).collect();
    a.sort_unstable();
    a.dedup();
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_name_round_trips_through_build_rs_parsing() {
        let n = file_name(0x0123_4567_89ab_cdef, 90);
        assert_eq!(n, "kernels-0123456789abcdef-sm90.cubin");
    }

    #[test]
    fn the_hash_separates_the_sources() {
        assert_ne!(source_hash(&["ab", "c"]), source_hash(&["a", "bc"]));
        assert_eq!(source_hash(&["x"]), fnv1a(b"x\0"));
    }
}

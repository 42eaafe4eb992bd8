//! symheap's own kernels compiled ahead of time for the common architectures and embedded in
//! the library (see `build.rs`), so a first init loads them directly: no NVRTC, no compile.
//! NVRTC still runs for other architectures, for tuning overrides (`SYMHEAP_COLL_DEFINES`
//! changes the source, so its hash matches nothing here) and for users' own modules.
//!
//! Each image records the NVRTC version that built it, so init hands the driver only images it
//! can load ([`super::compat::fit`]): the wheel's are built by the oldest CUDA 12 NVRTC that
//! compiles them well for each architecture, so every driver from CUDA 12.4 on loads them.

use super::compat::{fit, refusal, Fit, Version};
use crate::util::fnv1a;

/// The file name format, shared with `build.rs`.
#[cfg_attr(not(test), allow(dead_code))] // `parse_file_name` is build.rs's half, tested here
mod name {
    include!("prebuilt_name.rs");
}
pub use name::file_name;

/// One kernel image compiled ahead of time.
#[derive(Debug)]
pub(crate) struct Image {
    /// [`source_hash`] of the sources it was compiled from.
    pub(crate) hash: u64,
    /// The architecture it was compiled for (e.g. 90).
    pub(crate) arch: u32,
    /// The version of the NVRTC that built it.
    pub(crate) nvrtc: Version,
    /// The cubin.
    pub(crate) bytes: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/prebuilt.rs"));

/// Which kernel images init may use (`SYMHEAP_KERNEL_IMAGE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelImage {
    /// An embedded image the driver loads, else the on-disk cache, else NVRTC (the default).
    #[default]
    Auto,
    /// Only an embedded image: init fails, saying why, when none loads.
    Prebuilt,
    /// Only an embedded image built by an NVRTC of this CUDA major version (e.g. 12).
    PrebuiltMajor(i32),
    /// Never an embedded image: the cache, else NVRTC.
    Nvrtc,
}

impl KernelImage {
    /// Parses `auto`, `prebuilt`, `prebuilt-cu12` (any major), or `nvrtc`.
    pub fn parse(s: &str) -> Option<KernelImage> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(KernelImage::Auto),
            "prebuilt" => Some(KernelImage::Prebuilt),
            "nvrtc" => Some(KernelImage::Nvrtc),
            other => {
                let major = other.strip_prefix("prebuilt-cu")?;
                if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                major.parse().ok().map(KernelImage::PrebuiltMajor)
            }
        }
    }

    /// The setting as `SYMHEAP_KERNEL_IMAGE` spells it.
    pub fn name(&self) -> String {
        match self {
            KernelImage::Auto => "auto".into(),
            KernelImage::Prebuilt => "prebuilt".into(),
            KernelImage::PrebuiltMajor(m) => format!("prebuilt-cu{m}"),
            KernelImage::Nvrtc => "nvrtc".into(),
        }
    }

    /// Whether only an embedded image will do.
    pub(crate) fn prebuilt_only(&self) -> bool {
        matches!(self, KernelImage::Prebuilt | KernelImage::PrebuiltMajor(_))
    }
}

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

/// The images of `table` for sources `hash` to try on a GPU of `arch` (e.g. 86) under a driver
/// supporting CUDA `driver`, in order, and why the others that would run on the GPU were passed
/// over. An image runs on its own arch and later minor versions of its major (sm_80 code on
/// sm_86); the driver must load what its NVRTC built ([`fit`]). Images the driver loads
/// directly come first, then those that rely on minor version compatibility; the GPU's own arch
/// before an older one; the newest NVRTC first among direct ones, the oldest among the others.
pub(crate) fn candidates(
    table: &'static [Image],
    hash: u64,
    arch: u32,
    driver: Version,
    choice: KernelImage,
) -> (Vec<&'static Image>, Vec<String>) {
    let mut passed = Vec::new();
    let mut usable: Vec<(Fit, &'static Image)> = Vec::new();
    if choice == KernelImage::Nvrtc {
        return (Vec::new(), passed);
    }
    for img in table
        .iter()
        .filter(|i| i.hash == hash && i.arch / 10 == arch / 10 && i.arch <= arch)
    {
        let what = format!(
            "the sm_{} image built by NVRTC {}.{}",
            img.arch, img.nvrtc.0, img.nvrtc.1
        );
        if let KernelImage::PrebuiltMajor(m) = choice {
            if img.nvrtc.0 != m {
                passed.push(format!("{what} (SYMHEAP_KERNEL_IMAGE={})", choice.name()));
                continue;
            }
        }
        match fit(img.nvrtc, driver) {
            Fit::No => passed.push(format!("{what}: {}", refusal(img.nvrtc, driver))),
            f => usable.push((f, img)),
        }
    }
    usable.sort_by(|(fa, a), (fb, b)| {
        let by_nvrtc = if *fa == Fit::Direct {
            b.nvrtc.cmp(&a.nvrtc)
        } else {
            a.nvrtc.cmp(&b.nvrtc)
        };
        fb.cmp(fa).then(b.arch.cmp(&a.arch)).then(by_nvrtc)
    });
    (usable.into_iter().map(|(_, i)| i).collect(), passed)
}

/// The architectures this build carries prebuilt kernels for (empty for a plain `cargo build`).
pub fn archs() -> Vec<u32> {
    let mut a: Vec<u32> = PREBUILT.iter().map(|i| i.arch).collect();
    a.sort_unstable();
    a.dedup();
    a
}

/// The (arch, NVRTC version that built it) of every image this build carries, without repeats.
pub fn images() -> Vec<(u32, Version)> {
    let mut a: Vec<(u32, Version)> = PREBUILT.iter().map(|i| (i.arch, i.nvrtc)).collect();
    a.sort_unstable();
    a.dedup();
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    static CODE: [u8; 4] = *b"\x7fELF";

    const fn img(hash: u64, arch: u32, nvrtc: Version) -> Image {
        Image {
            hash,
            arch,
            nvrtc,
            bytes: &CODE,
        }
    }

    /// The wheel's table: sm_80 by NVRTC 12.0, sm_90 by 12.1, sm_100/sm_120 by 12.8, plus a
    /// CUDA 13 sm_90 image and another program's image.
    static TABLE: [Image; 6] = [
        img(1, 80, (12, 0)),
        img(1, 90, (12, 1)),
        img(1, 90, (13, 0)),
        img(1, 100, (12, 8)),
        img(1, 120, (12, 8)),
        img(2, 90, (12, 1)),
    ];

    fn picks(arch: u32, driver: i32, choice: KernelImage) -> (Vec<(u32, Version)>, Vec<String>) {
        let (c, passed) = candidates(
            &TABLE,
            1,
            arch,
            super::super::compat::driver_cuda(driver),
            choice,
        );
        (c.iter().map(|i| (i.arch, i.nvrtc)).collect(), passed)
    }

    #[test]
    fn the_file_name_round_trips_through_build_rs_parsing() {
        let n = file_name(0x0123_4567_89ab_cdef, 90, (12, 1));
        assert_eq!(n, "kernels-0123456789abcdef-sm90-nvrtc12.1.cubin");
        assert_eq!(
            name::parse_file_name(&n),
            Some((0x0123_4567_89ab_cdef, 90, (12, 1)))
        );
        // The format before images carried their NVRTC version is not read as one.
        assert_eq!(
            name::parse_file_name("kernels-0123456789abcdef-sm90.cubin"),
            None
        );
        assert_eq!(
            name::parse_file_name("kernels-0123-sm90-nvrtc12.1.cubin"),
            None
        );
    }

    #[test]
    fn the_hash_separates_the_sources() {
        assert_ne!(source_hash(&["ab", "c"]), source_hash(&["a", "bc"]));
        assert_eq!(source_hash(&["x"]), fnv1a(b"x\0"));
    }

    #[test]
    fn a_cuda_12_driver_gets_the_cuda_12_images_only() {
        // Driver 550 (CUDA 12.4) on an H100: the 12.1 image; the 13.0 one is refused, saying why.
        let (c, passed) = picks(90, 12040, KernelImage::Auto);
        assert_eq!(c, [(90, (12, 1))]);
        assert_eq!(passed.len(), 1, "{passed:?}");
        assert!(
            passed[0].contains("sm_90 image built by NVRTC 13.0")
                && passed[0].contains("need a CUDA 13 driver"),
            "{passed:?}"
        );
        // An A10 (sm_86) runs the sm_80 image.
        assert_eq!(picks(86, 12040, KernelImage::Auto).0, [(80, (12, 0))]);
        // A Blackwell on driver 570 (12.8): its own image; on 12.4 it would rely on minor
        // version compatibility (no such driver runs Blackwell, but the order is still defined).
        assert_eq!(picks(100, 12080, KernelImage::Auto).0, [(100, (12, 8))]);
        assert_eq!(picks(120, 12040, KernelImage::Auto).0, [(120, (12, 8))]);
        // No image of another major (sm_100 code does not run on sm_120) or a later arch.
        assert_eq!(picks(120, 13000, KernelImage::Auto).0, [(120, (12, 8))]);
        assert!(picks(75, 13000, KernelImage::Auto).0.is_empty());
    }

    #[test]
    fn a_cuda_13_driver_prefers_the_newest_nvrtc_and_the_choice_can_force_cuda_12() {
        assert_eq!(
            picks(90, 13000, KernelImage::Auto).0,
            [(90, (13, 0)), (90, (12, 1))]
        );
        let (c, passed) = picks(90, 13000, KernelImage::PrebuiltMajor(12));
        assert_eq!(c, [(90, (12, 1))]);
        assert!(
            passed[0].contains("NVRTC 13.0 (SYMHEAP_KERNEL_IMAGE=prebuilt-cu12)"),
            "{passed:?}"
        );
        assert_eq!(
            picks(90, 13000, KernelImage::PrebuiltMajor(13)).0,
            [(90, (13, 0))]
        );
        assert!(picks(90, 13000, KernelImage::Nvrtc).0.is_empty());
    }

    #[test]
    fn direct_images_come_before_minor_compatibility_ones() {
        static T: [Image; 3] = [
            img(1, 90, (12, 8)),
            img(1, 90, (12, 6)),
            img(1, 90, (12, 0)),
        ];
        let (c, _) = candidates(&T, 1, 90, (12, 4), KernelImage::Auto);
        let order: Vec<Version> = c.iter().map(|i| i.nvrtc).collect();
        assert_eq!(order, [(12, 0), (12, 6), (12, 8)]);
        let (c, _) = candidates(&T, 1, 90, (12, 9), KernelImage::Auto);
        let order: Vec<Version> = c.iter().map(|i| i.nvrtc).collect();
        assert_eq!(order, [(12, 8), (12, 6), (12, 0)]);
    }

    #[test]
    fn the_kernel_image_setting_parses_and_prints_back() {
        for (s, want) in [
            ("auto", KernelImage::Auto),
            ("Prebuilt", KernelImage::Prebuilt),
            ("prebuilt-cu12", KernelImage::PrebuiltMajor(12)),
            (" prebuilt-cu13 ", KernelImage::PrebuiltMajor(13)),
            ("nvrtc", KernelImage::Nvrtc),
        ] {
            assert_eq!(KernelImage::parse(s), Some(want), "{s}");
            assert_eq!(KernelImage::parse(&want.name()), Some(want));
        }
        for bad in [
            "",
            "cu12",
            "prebuilt-cu",
            "prebuilt-cu+1",
            "prebuilt-12",
            "jit",
        ] {
            assert_eq!(KernelImage::parse(bad), None, "{bad}");
        }
    }
}

//! Which compiled code a CUDA driver can load, and so which NVRTC (of those installed) and which
//! embedded kernel image symheap uses on it.
//!
//! Why the driver decides: a cubin carries the CUDA version of the compiler that made it. A
//! driver loads cubins made by its own CUDA version and older, and by a newer minor version of
//! its own major (CUDA's minor version compatibility: any 12.x cubin on a 12.x driver of R525 or
//! newer), never by a newer major: NVRTC 13's cubins fail on a CUDA 12 driver. symheap never
//! hands the driver PTX, which would need the driver's JIT to know the PTX version.
//!
//! Why the GPU's architecture decides too: each NVRTC knows a fixed set of architectures
//! (`nvrtcGetSupportedArchs`): NVRTC 12.4 has no sm_100, NVRTC 13 no sm_70.

/// A CUDA version as (major, minor), e.g. (12, 4).
pub(crate) type Version = (i32, i32);

/// The CUDA version a driver supports, from `cuDriverGetVersion`'s integer (12040 -> (12, 4)).
pub(crate) fn driver_cuda(v: i32) -> Version {
    (v / 1000, (v % 1000) / 10)
}

/// How a driver takes a cubin made by a given CUDA version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fit {
    /// Made by a newer major version: the driver refuses it.
    No,
    /// Made by a newer minor version of the driver's major: loads through minor version
    /// compatibility (R525+ for CUDA 12), which a driver older than documented may lack.
    Minor,
    /// Made by the driver's version or an older one: always loads.
    Direct,
}

/// How a driver supporting CUDA `driver` takes a cubin built by CUDA `built`.
pub(crate) fn fit(built: Version, driver: Version) -> Fit {
    if built <= driver {
        Fit::Direct
    } else if built.0 == driver.0 {
        Fit::Minor
    } else {
        Fit::No
    }
}

/// Why a driver refuses what `built` made, for messages.
pub(crate) fn refusal(built: Version, driver: Version) -> String {
    format!(
        "cubins of CUDA {}.{} need a CUDA {} driver ({}), and this driver supports CUDA {}.{}",
        built.0,
        built.1,
        built.0,
        driver_release(built.0),
        driver.0,
        driver.1
    )
}

/// The first driver release of a CUDA major version, for messages.
fn driver_release(major: i32) -> &'static str {
    match major {
        12 => "R525 or newer",
        13 => "R580 or newer",
        _ => "a newer driver",
    }
}

/// What the caller needs from NVRTC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Need {
    /// The CUDA version of the driver the cubins are for; `None` (no GPU: `symheap kernels`, the
    /// tests) accepts every NVRTC.
    pub(crate) driver: Option<Version>,
    /// The architecture to compile for (e.g. 90); `None` accepts every NVRTC.
    pub(crate) arch: Option<u32>,
    /// Only NVRTCs of this major version (`SYMHEAP_NVRTC`).
    pub(crate) major: Option<i32>,
}

/// One loaded NVRTC as the choice sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offer<'a> {
    /// `nvrtcVersion`.
    pub(crate) version: Version,
    /// `nvrtcGetSupportedArchs` (empty when that NVRTC cannot say: then any arch is tried).
    pub(crate) archs: &'a [u32],
    /// Where it was loaded from, for messages.
    pub(crate) label: &'a str,
}

/// Why `o` cannot serve `need`, or `None` when it can.
fn unfit(o: &Offer<'_>, need: Need) -> Option<String> {
    let (major, minor) = o.version;
    if let Some(m) = need.major.filter(|&m| m != major) {
        return Some(format!("SYMHEAP_NVRTC={m} asks for NVRTC {m}"));
    }
    if let Some(d) = need.driver {
        if fit(o.version, d) == Fit::No {
            return Some(refusal(o.version, d));
        }
    }
    if let Some(a) = need.arch {
        if !o.archs.is_empty() && !o.archs.contains(&a) {
            let known: Vec<String> = o.archs.iter().map(|a| format!("sm_{a}")).collect();
            return Some(format!(
                "NVRTC {major}.{minor} does not know sm_{a} (it knows {})",
                known.join(", ")
            ));
        }
    }
    None
}

/// The NVRTC of `offers` to use for `need`: among those whose cubins the driver loads and that
/// know the architecture, one no newer than the driver before one that relies on minor version
/// compatibility, then the newest (the newest compiler the driver runs); the first found on a
/// tie. Otherwise why each was passed over, and what to install.
pub(crate) fn choose(offers: &[Offer<'_>], need: Need) -> Result<usize, String> {
    let mut best: Option<(usize, (Fit, Version))> = None;
    let mut passed = Vec::new();
    for (i, o) in offers.iter().enumerate() {
        if let Some(why) = unfit(o, need) {
            passed.push(format!(
                "NVRTC {}.{} at {}: {why}",
                o.version.0, o.version.1, o.label
            ));
            continue;
        }
        let key = (
            need.driver.map_or(Fit::Direct, |d| fit(o.version, d)),
            o.version,
        );
        if best.is_none_or(|(_, k)| key > k) {
            best = Some((i, key));
        }
    }
    if let Some((i, _)) = best {
        return Ok(i);
    }
    let mut msg = format!("no NVRTC found here can be used: {}", passed.join("; "));
    let want = need.major.or(need.driver.map(|d| d.0));
    match want {
        Some(12) => msg.push_str(
            ". Install a CUDA 12 NVRTC (`pip install nvidia-cuda-nvrtc-cu12`, or `symheap[cu12]`)",
        ),
        Some(13) => msg.push_str(
            ". Install a CUDA 13 NVRTC (`pip install nvidia-cuda-nvrtc`, or `symheap[cu13]`)",
        ),
        _ => {}
    }
    if need.arch.is_some_and(|a| a >= 100) && want == Some(12) {
        msg.push_str(" of 12.8 or newer (the first to know Blackwell)");
    }
    Err(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The architectures real NVRTCs report (`nvrtcGetSupportedArchs`).
    const ARCHS_12_0: &[u32] = &[50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
    const ARCHS_12_4: &[u32] = &[50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
    const ARCHS_12_8: &[u32] = &[
        50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 120,
    ];
    const ARCHS_13_0: &[u32] = &[75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];

    fn offer(version: Version, archs: &'static [u32], label: &'static str) -> Offer<'static> {
        Offer {
            version,
            archs,
            label,
        }
    }

    fn need(driver: i32, arch: u32) -> Need {
        Need {
            driver: Some(driver_cuda(driver)),
            arch: Some(arch),
            major: None,
        }
    }

    #[test]
    fn the_driver_integer_reads_as_cuda_versions() {
        assert_eq!(driver_cuda(12040), (12, 4));
        assert_eq!(driver_cuda(12080), (12, 8));
        assert_eq!(driver_cuda(13000), (13, 0));
        assert_eq!(driver_cuda(12090), (12, 9));
    }

    #[test]
    fn a_driver_loads_its_own_and_older_cubins_and_newer_minors_of_its_major() {
        assert_eq!(fit((12, 1), (12, 4)), Fit::Direct);
        assert_eq!(fit((12, 4), (12, 4)), Fit::Direct);
        assert_eq!(fit((12, 8), (13, 0)), Fit::Direct);
        assert_eq!(fit((12, 8), (12, 4)), Fit::Minor);
        assert_eq!(fit((13, 0), (12, 9)), Fit::No);
        assert_eq!(fit((13, 1), (13, 0)), Fit::Minor);
        let why = refusal((13, 0), (12, 4));
        assert!(
            why.contains("need a CUDA 13 driver (R580 or newer)"),
            "{why}"
        );
        assert!(why.contains("supports CUDA 12.4"), "{why}");
    }

    #[test]
    fn a_cuda_12_driver_skips_nvrtc_13_and_says_why_when_nothing_else_is_there() {
        let both = [
            offer((13, 0), ARCHS_13_0, "/site/nvidia/cu13/lib/libnvrtc.so.13"),
            offer(
                (12, 4),
                ARCHS_12_4,
                "/site/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            ),
        ];
        assert_eq!(choose(&both, need(12040, 90)), Ok(1));
        assert_eq!(choose(&both, need(12080, 80)), Ok(1));
        let only13 = &both[..1];
        let e = choose(only13, need(12040, 90)).unwrap_err();
        assert!(
            e.contains("NVRTC 13.0 at /site/nvidia/cu13/lib/libnvrtc.so.13"),
            "{e}"
        );
        assert!(e.contains("need a CUDA 13 driver"), "{e}");
        assert!(e.contains("pip install nvidia-cuda-nvrtc-cu12"), "{e}");
    }

    #[test]
    fn a_cuda_13_driver_takes_the_newest_nvrtc_that_knows_the_gpu() {
        let both = [
            offer((12, 4), ARCHS_12_4, "twelve"),
            offer((13, 0), ARCHS_13_0, "thirteen"),
        ];
        assert_eq!(choose(&both, need(13000, 90)), Ok(1));
        assert_eq!(choose(&both, need(13000, 100)), Ok(1));
        // NVRTC 13 has no Volta: a V100 on a 580 driver compiles with NVRTC 12.
        assert_eq!(choose(&both, need(13000, 70)), Ok(0));
        let e = choose(&both[1..], need(13000, 70)).unwrap_err();
        assert!(e.contains("NVRTC 13.0 does not know sm_70"), "{e}");
    }

    #[test]
    fn blackwell_needs_nvrtc_12_8_on_a_cuda_12_driver() {
        let found = [
            offer((12, 4), ARCHS_12_4, "12.4"),
            offer((12, 8), ARCHS_12_8, "12.8"),
        ];
        assert_eq!(choose(&found, need(12080, 100)), Ok(1));
        assert_eq!(choose(&found, need(12090, 120)), Ok(1));
        let e = choose(&found[..1], need(12080, 120)).unwrap_err();
        assert!(e.contains("NVRTC 12.4 does not know sm_120"), "{e}");
        assert!(e.contains("12.8 or newer"), "{e}");
    }

    #[test]
    fn an_nvrtc_no_newer_than_the_driver_comes_before_minor_version_compatibility() {
        let found = [
            offer((12, 8), ARCHS_12_8, "12.8"),
            offer((12, 0), ARCHS_12_0, "12.0"),
        ];
        // Driver 550 (CUDA 12.4): 12.0 loads directly, 12.8 only through minor compatibility.
        assert_eq!(choose(&found, need(12040, 90)), Ok(1));
        // Only the newer minor there: used.
        assert_eq!(choose(&found[..1], need(12040, 90)), Ok(0));
        // Driver 570 (12.8): both load directly, the newer is taken.
        assert_eq!(choose(&found, need(12080, 90)), Ok(0));
    }

    #[test]
    fn symheap_nvrtc_forces_a_major_version() {
        let both = [
            offer((13, 0), ARCHS_13_0, "thirteen"),
            offer((12, 4), ARCHS_12_4, "twelve"),
        ];
        let mut n = need(13000, 90);
        n.major = Some(12);
        assert_eq!(choose(&both, n), Ok(1));
        n.major = Some(13);
        assert_eq!(choose(&both, n), Ok(0));
        n.major = Some(12);
        let e = choose(&both[..1], n).unwrap_err();
        assert!(e.contains("SYMHEAP_NVRTC=12 asks for NVRTC 12"), "{e}");
    }

    #[test]
    fn without_a_driver_the_newest_is_taken_and_ties_keep_the_search_order() {
        let found = [
            offer((12, 4), ARCHS_12_4, "a"),
            offer((13, 0), ARCHS_13_0, "b"),
            offer((13, 0), ARCHS_13_0, "c"),
        ];
        assert_eq!(choose(&found, Need::default()), Ok(1));
        // An NVRTC that cannot list its architectures is tried for any.
        let unknown = [offer((12, 4), &[], "old")];
        assert_eq!(choose(&unknown, need(12040, 100)), Ok(0));
        assert!(choose(&[], Need::default()).is_err());
    }
}

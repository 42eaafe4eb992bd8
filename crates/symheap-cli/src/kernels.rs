//! `symheap kernels`: symheap's own kernels compiled to cubins ahead of time, for a build that
//! embeds them (`SYMHEAP_PREBUILT_KERNELS`), so a user's first init runs no NVRTC.

use std::path::Path;

use symheap::cuda::{compile_shipped, nvrtc, shipped_sources};

/// Compiles every shipped kernel source for every arch in `archs` into `out`; returns the exit
/// status (1 naming what failed).
pub(crate) fn build(out: &Path, archs: &[u32]) -> i32 {
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("symheap kernels: cannot create {}: {e}", out.display());
        return 1;
    }
    match nvrtc::version() {
        Ok((major, minor)) => eprintln!(
            "symheap kernels: NVRTC {major}.{minor} ({})",
            nvrtc::library_path()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ),
        Err(e) => {
            eprintln!("symheap kernels: {e}");
            return 1;
        }
    }
    let jobs: Vec<(&'static str, String, u32)> = shipped_sources()
        .into_iter()
        .flat_map(|(name, source)| archs.iter().map(move |&a| (name, source.clone(), a)))
        .collect();
    // NVRTC compiles one program per thread; the collective kernels take 10-15 s per arch.
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, source, arch)) = jobs.get(i) else {
                    break;
                };
                if let Err(e) = compile_one(out, name, source, *arch) {
                    eprintln!("symheap kernels: {e}");
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    i32::from(failed.into_inner())
}

/// Compiles `source` for `arch` and writes it under the name the library looks it up by.
fn compile_one(out: &Path, name: &str, source: &str, arch: u32) -> Result<(), String> {
    let t0 = std::time::Instant::now();
    let (file, image) = compile_shipped(source, name, arch)
        .map_err(|log| format!("{name} for sm_{arch}: {log}"))?;
    let path = out.join(file);
    std::fs::write(&path, &image).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!(
        "symheap kernels: {name} sm_{arch}: {} KiB in {:.1} s -> {}",
        image.len() / 1024,
        t0.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(())
}

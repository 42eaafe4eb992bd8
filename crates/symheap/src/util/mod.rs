//! Small helpers every layer uses: library search and stable hashing.

pub(crate) mod libsearch;

/// FNV-1a, 64 bit: a stable hash that every PE and every symheap build computes alike.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where the time of a multi-step operation went (init's phases in the banner): each
/// [`mark`](Phases::mark) closes the phase that began at the previous mark.
#[derive(Debug, Clone)]
pub(crate) struct Phases {
    last: std::time::Instant,
    pub(crate) list: Vec<(&'static str, std::time::Duration)>,
}

impl Phases {
    /// Starts the first phase now.
    pub(crate) fn start() -> Phases {
        Phases {
            last: std::time::Instant::now(),
            list: Vec::new(),
        }
    }

    /// Ends the current phase, naming it, and starts the next.
    pub(crate) fn mark(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.list.push((name, now - self.last));
        self.last = now;
    }

    /// "12.3 ms (bootstrap 1.0, kernels 10.2, ... ms)".
    pub(crate) fn render(&self) -> String {
        let total: std::time::Duration = self.list.iter().map(|(_, d)| *d).sum();
        let parts: Vec<String> = self
            .list
            .iter()
            .map(|(n, d)| format!("{n} {:.1}", d.as_secs_f64() * 1e3))
            .collect();
        format!(
            "{:.1} ms ({} ms)",
            total.as_secs_f64() * 1e3,
            parts.join(", ")
        )
    }
}

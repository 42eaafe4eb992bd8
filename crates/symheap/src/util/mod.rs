//! Small helpers every layer uses: library search, stable hashing, and copies of memory that
//! others access at the same time.

pub(crate) mod libsearch;
pub(crate) mod racy;
pub(crate) mod vcopy;

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

/// `1048576` → `1 MiB`, for messages.
pub fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 && (b >> (10 * (i + 1))) << (10 * (i + 1)) == b {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{} {}", v as u64, U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_well() {
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(1536), "1536 B");
    }
}

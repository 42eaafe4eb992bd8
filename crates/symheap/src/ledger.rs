//! The collective ledger: every collective call is recorded, and PEs compare records at host
//! collective points, so diverging call sequences fail on every PE with the first differing
//! call named, instead of hanging or silently corrupting memory.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use crate::util::fnv1a;

/// At most this many calls since the last agreed point are kept verbatim for the message; the
/// running hash still covers every call.
const KEPT: usize = 1024;

/// One recorded collective call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The call (`allocate`, `barrier_all`, `grow`...).
    pub call: Cow<'static, str>,
    /// Its arguments as text, already in the form a user reads (shared: a call repeated in a
    /// loop records the same text without copying it).
    pub args: Arc<str>,
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.call, self.args)
    }
}

/// This PE's record.
#[derive(Debug, Default)]
pub struct Ledger {
    count: u64,
    hash: u64,
    agreed: u64,
    /// The calls since the last agreement, at most [`KEPT`] of them (`kept`), as runs of one
    /// entry repeated: a call in a loop extends its run without cloning its text (an `Arc`
    /// clone is a locked instruction, and the clones were dropped again at the next agreement).
    since: Vec<(Entry, u32)>,
    kept: usize,
}

/// The hash of one call: what [`Ledger::record_hashed`] chains into the running hash.
pub fn call_hash(call: &str, args: &str) -> u64 {
    fnv1a_parts(&[call.as_bytes(), &[0], args.as_bytes()])
}

/// FNV-1a over the concatenation of `parts` (no copy).
fn fnv1a_parts(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The running hash after a call of hash `h`: order-sensitive (the rotation), with a full
/// 64-bit mix (splitmix64's finaliser). Two multiplies instead of FNV's sixteen dependent
/// ones over the two words: the chaining was a tenth of a small collective's own cost.
fn chain(hash: u64, h: u64) -> u64 {
    let mut z = hash.rotate_left(23) ^ h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The empty argument text, shared (an `Arc<str>` of its own would allocate per call).
pub(crate) fn no_args() -> Arc<str> {
    static EMPTY: OnceLock<Arc<str>> = OnceLock::new();
    EMPTY.get_or_init(|| Arc::from("")).clone()
}

impl Ledger {
    /// An empty record.
    pub fn new() -> Self {
        Ledger {
            hash: fnv1a(b"symheap-ledger"),
            ..Default::default()
        }
    }

    /// Records a call.
    #[cfg(test)]
    pub fn record(&mut self, call: &'static str, args: String) {
        let h = call_hash(call, &args);
        let args = if args.is_empty() {
            no_args()
        } else {
            Arc::from(args)
        };
        self.record_hashed(call, &args, h);
    }

    /// Records a call whose [`call_hash`] the caller already knows (a repeated call: no text
    /// is formatted, hashed or copied again). Kept for the message while fewer than [`KEPT`]
    /// calls are; the same call as the last one (the same name and text, by address) extends
    /// the last run instead of cloning `args`.
    #[inline]
    pub fn record_hashed(&mut self, call: &'static str, args: &Arc<str>, h: u64) {
        self.hash = chain(self.hash, h);
        self.count += 1;
        // Inline up to here: a call in a long loop is past `KEPT` and stops at this test.
        if self.kept < KEPT {
            self.keep(call, args);
        }
    }

    /// Keeps a call just recorded for the message (see `record_hashed`).
    fn keep(&mut self, call: &'static str, args: &Arc<str>) {
        self.kept += 1;
        if let Some((e, n)) = self.since.last_mut() {
            let same_call = matches!(e.call, Cow::Borrowed(c) if std::ptr::eq(c, call));
            if same_call && Arc::ptr_eq(&e.args, args) {
                *n += 1;
                return;
            }
        }
        self.since.push((
            Entry {
                call: Cow::Borrowed(call),
                args: args.clone(),
            },
            1,
        ));
    }

    /// (calls recorded, running hash): equal on every PE exactly when the call sequences are.
    pub fn digest(&self) -> (u64, u64) {
        (self.count, self.hash)
    }

    /// Marks everything recorded so far as agreed by every PE (after digests compared equal).
    pub fn mark_agreed(&mut self) {
        self.agreed = self.count;
        self.since.clear();
        self.kept = 0;
    }

    /// `encode`, keeping only as many entries as fit in `max` bytes.
    pub fn encode_limited(&self, max: usize) -> Vec<u8> {
        let mut keep = self.kept;
        loop {
            let e = self.encode_first(keep);
            if e.len() <= max || keep == 0 {
                return e;
            }
            keep /= 2;
        }
    }

    /// What this PE contributes to a comparison.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_first(self.kept)
    }

    fn encode_first(&self, keep: usize) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.hash.to_le_bytes());
        out.extend_from_slice(&self.agreed.to_le_bytes());
        out.extend_from_slice(&(keep as u32).to_le_bytes());
        let calls = self
            .since
            .iter()
            .flat_map(|(e, n)| std::iter::repeat_n(e, *n as usize));
        for e in calls.take(keep) {
            for s in [&*e.call, &*e.args] {
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
        out
    }

    /// Compares every PE's record (`parts[r]` from `encode` on PE r). On agreement, marks the
    /// calls as agreed. On divergence, returns the message every PE will report: the first
    /// differing call and what each PE called there. Pure, so every PE computes the same text.
    pub fn compare(&mut self, parts: &[&[u8]]) -> Result<(), String> {
        let pes: Vec<usize> = (0..parts.len()).collect();
        self.compare_named(parts, &pes)
    }

    /// `compare`, where `parts[i]` came from world PE `pes[i]` (for teams).
    pub fn compare_named(&mut self, parts: &[&[u8]], pes: &[usize]) -> Result<(), String> {
        let decoded: Vec<Decoded> = parts
            .iter()
            .enumerate()
            .map(|(r, p)| {
                Decoded::parse(p).ok_or_else(|| format!("PE {r} sent an unreadable ledger"))
            })
            .collect::<Result<_, _>>()?;
        let first = &decoded[0];
        if decoded
            .iter()
            .all(|d| d.count == first.count && d.hash == first.hash)
        {
            self.mark_agreed();
            return Ok(());
        }
        let base = decoded.iter().map(|d| d.agreed).min().unwrap_or(0);
        let longest = decoded.iter().map(|d| d.entries.len()).max().unwrap_or(0);
        for i in 0..longest {
            let at: Vec<Option<&Entry>> = decoded.iter().map(|d| d.entries.get(i)).collect();
            if at.iter().all(|e| *e == at[0]) {
                continue;
            }
            return Err(format!(
                "collective call #{} differs between PEs: {}",
                base + i as u64 + 1,
                group(&at, pes, "nothing (no further collective call)")
            ));
        }
        let counts: Vec<Option<&u64>> = decoded.iter().map(|d| Some(&d.count)).collect();
        Err(format!(
            "the PEs' collective calls differ after the first {KEPT} calls since their last agreement; calls made per PE: {}",
            group(&counts, pes, "")
        ))
    }
}

/// "PEs 0, 2: allocate(1 MiB); PE 1: allocate(2 MiB)".
fn group<T: std::fmt::Display + PartialEq>(at: &[Option<&T>], pes: &[usize], none: &str) -> String {
    let mut groups: Vec<(Option<&T>, Vec<usize>)> = Vec::new();
    for (i, e) in at.iter().enumerate() {
        let r = pes[i];
        match groups.iter_mut().find(|(g, _)| g == e) {
            Some((_, pes)) => pes.push(r),
            None => groups.push((*e, vec![r])),
        }
    }
    groups
        .iter()
        .map(|(e, pes)| {
            let who = if pes.len() == 1 {
                format!("PE {}", pes[0])
            } else {
                let l: Vec<String> = pes.iter().map(|p| p.to_string()).collect();
                format!("PEs {}", l.join(", "))
            };
            match e {
                Some(e) => format!("{who} called {e}"),
                None => format!("{who} called {none}"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

struct Decoded {
    count: u64,
    hash: u64,
    agreed: u64,
    entries: Vec<Entry>,
}

impl Decoded {
    fn parse(mut b: &[u8]) -> Option<Decoded> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            if b.len() < n {
                return None;
            }
            let (x, y) = b.split_at(n);
            *b = y;
            Some(x)
        }
        let u64_ = |b: &mut &[u8]| Some(u64::from_le_bytes(take(b, 8)?.try_into().ok()?));
        let u32_ = |b: &mut &[u8]| Some(u32::from_le_bytes(take(b, 4)?.try_into().ok()?));
        let count = u64_(&mut b)?;
        let hash = u64_(&mut b)?;
        let agreed = u64_(&mut b)?;
        let n = u32_(&mut b)? as usize;
        if n > KEPT {
            return None;
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let l = u32_(&mut b)? as usize;
            let call = String::from_utf8(take(&mut b, l)?.to_vec()).ok()?;
            let l = u32_(&mut b)? as usize;
            let args = String::from_utf8(take(&mut b, l)?.to_vec()).ok()?;
            entries.push(Entry {
                call: Cow::Owned(call),
                args: Arc::from(args),
            });
        }
        b.is_empty().then_some(Decoded {
            count,
            hash,
            agreed,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_and_first_divergence() {
        let mut l: Vec<Ledger> = (0..3).map(|_| Ledger::new()).collect();
        for x in l.iter_mut() {
            x.record("allocate", "1 MiB".into());
        }
        let enc: Vec<Vec<u8>> = l.iter().map(|x| x.encode()).collect();
        let refs: Vec<&[u8]> = enc.iter().map(|e| e.as_slice()).collect();
        for x in l.iter_mut() {
            x.compare(&refs).unwrap();
        }
        l[0].record("allocate", "1 MiB".into());
        l[1].record("allocate", "2 MiB".into());
        l[2].record("allocate", "1 MiB".into());
        for x in l.iter_mut() {
            x.record("barrier_all", String::new());
        }
        let enc: Vec<Vec<u8>> = l.iter().map(|x| x.encode()).collect();
        let refs: Vec<&[u8]> = enc.iter().map(|e| e.as_slice()).collect();
        let msgs: Vec<String> = l
            .iter_mut()
            .map(|x| x.compare(&refs).unwrap_err())
            .collect();
        assert_eq!(msgs[0], msgs[1]);
        assert_eq!(
            msgs[0],
            "collective call #2 differs between PEs: PEs 0, 2 called allocate(1 MiB); PE 1 called allocate(2 MiB)"
        );
    }

    #[test]
    fn the_running_hash_tells_call_sequences_apart() {
        // Every sequence of three of four calls (order matters, repeats allowed): 64 digests,
        // all different, and the same sequence twice gives the same digest.
        let calls = [
            ("barrier_all", ""),
            ("allocate", "1 MiB"),
            ("allocate", "2 MiB"),
            ("broadcast", "root 0"),
        ];
        let mut seen = std::collections::HashMap::new();
        for code in 0..64usize {
            let digest = |_: ()| {
                let mut l = Ledger::new();
                for k in 0..3 {
                    let (c, a) = calls[code >> (2 * k) & 3];
                    l.record(c, a.to_string());
                }
                l.digest()
            };
            assert_eq!(digest(()), digest(()));
            assert_eq!(
                seen.insert(digest(()), code),
                None,
                "sequence {code} collides"
            );
        }
    }

    #[test]
    fn runs_of_one_call_keep_every_position() {
        // A call repeated in a loop is kept as one run; the message still counts every call,
        // and a run of the same text from another `Arc` (not extended) compares the same.
        let args: Arc<str> = Arc::from("root 0, 8 x u8");
        let mut a = Ledger::new();
        let mut b = Ledger::new();
        for _ in 0..5 {
            a.record_hashed("broadcast", &args, call_hash("broadcast", &args));
        }
        for k in 0..5 {
            let other: Arc<str> = Arc::from(&*args);
            let (call, text) = if k == 3 {
                ("barrier_all", Arc::from(""))
            } else {
                ("broadcast", other)
            };
            b.record_hashed(call, &text, call_hash(call, &text));
        }
        assert_eq!(a.since.len(), 1, "one run for five identical calls");
        let (ea, eb) = (a.encode(), b.encode());
        let msg = a.compare(&[&ea, &eb]).unwrap_err();
        assert_eq!(
            msg,
            "collective call #4 differs between PEs: PE 0 called broadcast(root 0, 8 x u8); PE 1 called barrier_all()"
        );
        // Past KEPT calls nothing more is kept, and the runs still expand to exactly KEPT.
        let mut c = Ledger::new();
        for _ in 0..KEPT + 10 {
            c.record_hashed("broadcast", &args, 1);
        }
        assert_eq!(Decoded::parse(&c.encode()).unwrap().entries.len(), KEPT);
        c.mark_agreed();
        assert_eq!(Decoded::parse(&c.encode()).unwrap().entries.len(), 0);
    }

    #[test]
    fn missing_call_is_named() {
        let mut a = Ledger::new();
        let mut b = Ledger::new();
        a.record("barrier_all", String::new());
        b.record("barrier_all", String::new());
        b.record("barrier_all", String::new());
        let (ea, eb) = (a.encode(), b.encode());
        let msg = a.compare(&[&ea, &eb]).unwrap_err();
        assert!(msg.contains("#2"), "{msg}");
        assert!(msg.contains("PE 0 called nothing"), "{msg}");
    }
}

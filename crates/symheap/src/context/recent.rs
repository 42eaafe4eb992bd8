//! A team's recent calls, as `Inner::record_keyed` keeps them (`TeamState::recent`): the key
//! of each call and its text, hashed and cut into ring words once, so that a call in a loop is
//! recorded and published without formatting its text again. Below both the team state that
//! holds them and the watch that publishes them.

use std::sync::Arc;

use super::area::TEXT_WORDS;

/// A call recently recorded on a team, kept for `Inner::record_keyed`.
#[derive(Debug)]
pub(crate) struct Recorded {
    pub(super) key: CallKey,
    pub(super) hash: u64,
    pub(super) args: Arc<str>,
    pub(super) len: u64,
    pub(super) words: [u64; TEXT_WORDS as usize],
}

/// Calls kept per team for `Inner::record_keyed`.
pub(super) const RECENT_CALLS: usize = 8;

/// What identifies a call's argument text: the call and up to eight numbers (counts, codes of
/// dtype/op/algorithm, root, heap offsets) from which the text is formatted.
#[derive(Debug, Clone, Copy, Eq)]
pub(crate) struct CallKey {
    pub(crate) call: &'static str,
    pub(crate) nums: [u64; 8],
}

impl PartialEq for CallKey {
    /// The numbers first, then the call's name by address (the same literal, as in a loop)
    /// before its bytes: the derived comparison ran `memcmp` on the name for every recent call
    /// looked at.
    fn eq(&self, other: &Self) -> bool {
        // OR of the XORs: the derived `[u64; 8]` comparison was a call to `memcmp`.
        let differ = (self.nums.iter().zip(&other.nums)).fold(0, |d, (a, b)| d | (a ^ b));
        differ == 0 && (std::ptr::eq(self.call, other.call) || self.call == other.call)
    }
}

/// `call(args)` as published in the ring (cut as `text_words` in watch.rs cuts), without
/// allocating.
pub(super) fn call_words(call: &str, args: &str) -> (u64, [u64; TEXT_WORDS as usize]) {
    let mut buf = [0u8; 8 * TEXT_WORDS as usize];
    let mut n = 0;
    let mut full = 0;
    for part in [call, "(", args, ")"] {
        let b = part.as_bytes();
        let take = b.len().min(buf.len() - n);
        buf[n..n + take].copy_from_slice(&b[..take]);
        n += take;
        full += b.len();
    }
    // Cut at a character boundary: the byte after the cut must not continue a character.
    if n < full {
        let next = [call, "(", args, ")"]
            .iter()
            .flat_map(|p| p.bytes())
            .nth(n)
            .unwrap_or(0);
        let mut continues = next & 0xc0 == 0x80;
        while n > 0 && continues {
            n -= 1;
            continues = buf[n] & 0xc0 == 0x80;
        }
    }
    buf[n..].fill(0);
    let mut words = [0u64; TEXT_WORDS as usize];
    for (w, c) in words.iter_mut().zip(buf.chunks_exact(8)) {
        *w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    (n as u64, words)
}

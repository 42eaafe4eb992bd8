//! Proof of job membership at the rendezvous, without the secret ever on the wire.
//!
//! Every PE holds the job token (`SYMHEAP_TOKEN`, or one derived from the launch environment,
//! see `env.rs`). A connecting PE sends a nonce and the job's public *fingerprint* (a hash of
//! the token, shown in errors as the job identity); PE 0 answers, only when the fingerprints
//! match, with its own nonce and an HMAC-SHA256 over both nonces; the PE checks that MAC before
//! it sends anything else and answers with a MAC of its own, which PE 0 checks before it
//! admits the PE. The two MACs carry different labels, so neither side's answer can be
//! reflected as the other's, and fresh nonces on both sides mean a recorded exchange proves
//! nothing later. What a listener that is not the job learns is the fingerprint and MACs over
//! nonces it cannot choose on both sides: nothing it can replay.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::error::{bootstrap, Result};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of each side's nonce.
pub(crate) const NONCE_LEN: usize = 32;
/// Bytes of a MAC (HMAC-SHA256).
pub(crate) const MAC_LEN: usize = 32;

/// The job's public identity: the first 8 bytes of SHA-256 over a domain label and the token,
/// as 16 hex digits. Two jobs with different tokens have different fingerprints; the
/// fingerprint says nothing about the token that a MAC exchange would not.
pub(crate) fn fingerprint(token: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"symheap job fingerprint\0");
    h.update(token);
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh random nonce.
pub(crate) fn nonce() -> Result<Vec<u8>> {
    let mut n = vec![0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| {
        bootstrap(
            "init",
            format!("cannot get random bytes for the rendezvous: {e}"),
        )
    })?;
    Ok(n)
}

/// Who computes a MAC: PE 0 proves itself to a PE, or a PE to PE 0.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    Root,
    Peer,
}

/// What both MACs of one exchange bind: the two nonces, the connecting PE's rank, the world
/// size and the fingerprint.
pub(crate) struct Transcript<'a> {
    pub(crate) client_nonce: &'a [u8],
    pub(crate) server_nonce: &'a [u8],
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) fingerprint: &'a str,
}

impl Transcript<'_> {
    fn keyed(&self, token: &[u8], side: Side) -> HmacSha256 {
        let mut m =
            <HmacSha256 as KeyInit>::new_from_slice(token).expect("HMAC takes a key of any length");
        m.update(match side {
            Side::Root => b"symheap rendezvous v2: PE 0 to PE\0",
            Side::Peer => b"symheap rendezvous v2: PE to PE 0\0",
        });
        for part in [
            self.client_nonce,
            self.server_nonce,
            self.fingerprint.as_bytes(),
        ] {
            m.update(&(part.len() as u32).to_le_bytes());
            m.update(part);
        }
        m.update(&self.rank.to_le_bytes());
        m.update(&self.world.to_le_bytes());
        m
    }

    /// The MAC `side` sends.
    pub(crate) fn mac(&self, token: &[u8], side: Side) -> Vec<u8> {
        self.keyed(token, side).finalize().into_bytes().to_vec()
    }

    /// Whether `mac` is `side`'s MAC under `token` (compared in constant time).
    pub(super) fn verify(&self, token: &[u8], side: Side, mac: &[u8]) -> bool {
        self.keyed(token, side).verify_slice(mac).is_ok()
    }
}

/// HMAC-SHA256 of `data` under `key`: a job token derived from the user's secret.
pub(crate) fn derive(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(key).expect("any key length");
    m.update(b"symheap job token\0");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(c: &'a [u8], s: &'a [u8]) -> Transcript<'a> {
        Transcript {
            client_nonce: c,
            server_nonce: s,
            rank: 1,
            world: 4,
            fingerprint: "0011223344556677",
        }
    }

    #[test]
    fn macs_bind_the_token_the_side_and_every_field() {
        let (c, s) = (nonce().unwrap(), nonce().unwrap());
        let tr = t(&c, &s);
        let mac = tr.mac(b"secret", Side::Root);
        assert_eq!(mac.len(), MAC_LEN);
        assert!(tr.verify(b"secret", Side::Root, &mac));
        // Another token, the other side's label (a reflected answer), other nonces, another
        // rank or world: all refused.
        assert!(!tr.verify(b"secreT", Side::Root, &mac));
        assert!(!tr.verify(b"secret", Side::Peer, &mac));
        assert!(!t(&s, &c).verify(b"secret", Side::Root, &mac));
        let other = Transcript {
            rank: 2,
            ..t(&c, &s)
        };
        assert!(!other.verify(b"secret", Side::Root, &mac));
        let other = Transcript {
            world: 5,
            ..t(&c, &s)
        };
        assert!(!other.verify(b"secret", Side::Root, &mac));
        assert!(!tr.verify(b"secret", Side::Root, &mac[..31]));
    }

    #[test]
    fn fingerprints_and_nonces() {
        assert_eq!(fingerprint(b"a"), fingerprint(b"a"));
        assert_ne!(fingerprint(b"a"), fingerprint(b"b"));
        assert_eq!(fingerprint(b"a").len(), 16);
        assert_ne!(nonce().unwrap(), nonce().unwrap());
        assert_ne!(derive(b"k1", b"job"), derive(b"k2", b"job"));
    }
}

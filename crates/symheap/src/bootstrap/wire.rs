//! The bootstrap's wire format: versioned, length-checked frames.
//!
//! A frame is `magic "SYMH" | version u16 | kind u8 | reserved u8 | length u32 | payload`, all
//! little endian. The decoder never trusts a length it has not checked against both the bytes
//! it holds and [`MAX_PAYLOAD`], so a stray client, a port scanner or a different symheap
//! version gets a clean error rather than a huge allocation or a panic.

use std::io::{Read, Write};

/// Bumped whenever a message layout changes; peers of another version are refused by name.
pub const WIRE_VERSION: u16 = 3;
/// Frame header bytes.
pub const HEADER_LEN: usize = 12;
/// Largest payload accepted (an all_gather result of a few MiB per PE fits easily).
pub const MAX_PAYLOAD: usize = 256 << 20;
const MAGIC: &[u8; 4] = b"SYMH";

/// One bootstrap message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// First message of a connection to the root: who I am, which job I belong to (public),
    /// and a nonce for the root to prove it holds the job token. No secret.
    Hello {
        /// Sender's rank.
        rank: u32,
        /// Sender's idea of the world size.
        world: u32,
        /// The sender's fresh nonce.
        nonce: Vec<u8>,
        /// The job's public fingerprint (a hash of the token); the root refuses another.
        fingerprint: String,
        /// Where the sender's token comes from, for messages ("SYMHEAP_TOKEN", ...).
        source: String,
    },
    /// The root's answer to a Hello of this job: its nonce and its proof of the token.
    Challenge {
        /// The root's fresh nonce.
        nonce: Vec<u8>,
        /// HMAC of the token over both nonces, the rank, world and fingerprint.
        mac: Vec<u8>,
    },
    /// The connecting PE's proof of the token, sent once the root's proof checked out, with
    /// what it says about itself only to a root that proved the token.
    Proof {
        /// HMAC of the token over both nonces, the rank, world and fingerprint.
        mac: Vec<u8>,
        /// The sender's process id, for messages.
        pid: u32,
        /// The sender's host name, for messages.
        host: String,
        /// Empty, or why the sender knows a second job shares the rendezvous (it found a
        /// twin of itself, `census.rs`): a root that checks its proof ends its job.
        conflict: String,
    },
    /// Root accepted the proof.
    Welcome,
    /// Root refused the connection, with the reason.
    Reject {
        /// Why.
        reason: String,
    },
    /// A PE's contribution to collective number `seq`.
    Contribute {
        /// Per-PE collective sequence number.
        seq: u64,
        /// A label for diagnostics ("barrier_all", "grow"...).
        what: String,
        /// The bytes.
        data: Vec<u8>,
    },
    /// All contributions to collective `seq`, in rank order.
    Gathered {
        /// Sequence number.
        seq: u64,
        /// One entry per PE.
        parts: Vec<Vec<u8>>,
    },
    /// The job is failing: `origin` is the PE where it started (or that died).
    Abort {
        /// The PE the failure is about.
        origin: u32,
        /// What kind of failure.
        class: AbortClass,
        /// Human-readable cause (for a timeout: what was waited for).
        reason: String,
        /// For a timeout: the PEs that did not arrive.
        missing: Vec<u32>,
        /// For a timeout: how long was waited, in milliseconds.
        waited_ms: u64,
    },
    /// The sender is finalizing cleanly; its connection closing next is not a failure.
    Bye,
}

/// Why a job is being aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortClass {
    /// A PE reported an error.
    Error,
    /// A PE exited or its connection broke.
    Exited,
    /// A collective did not complete in time.
    Timeout,
    /// PEs made different collective calls (the reason is the mismatch message every PE
    /// reports).
    Mismatch,
}

/// A frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Bytes that do not start with the magic: not a symheap peer.
    #[error("not a symheap bootstrap connection (bad magic)")]
    BadMagic,
    /// A symheap peer of another wire version.
    #[error("peer speaks bootstrap wire version {0}, this is version {WIRE_VERSION}: mixing symheap versions in one job is not supported")]
    Version(u16),
    /// Unknown message kind.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// The declared length exceeds the limit.
    #[error("frame of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    TooLong(usize),
    /// The bytes ended early or a field is inconsistent.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

const K_HELLO: u8 = 1;
const K_WELCOME: u8 = 2;
const K_REJECT: u8 = 3;
const K_CONTRIBUTE: u8 = 4;
const K_GATHERED: u8 = 5;
const K_ABORT: u8 = 6;
const K_BYE: u8 = 7;
const K_CHALLENGE: u8 = 8;
const K_PROOF: u8 = 9;

impl Msg {
    fn kind(&self) -> u8 {
        match self {
            Msg::Hello { .. } => K_HELLO,
            Msg::Welcome => K_WELCOME,
            Msg::Reject { .. } => K_REJECT,
            Msg::Contribute { .. } => K_CONTRIBUTE,
            Msg::Gathered { .. } => K_GATHERED,
            Msg::Abort { .. } => K_ABORT,
            Msg::Bye => K_BYE,
            Msg::Challenge { .. } => K_CHALLENGE,
            Msg::Proof { .. } => K_PROOF,
        }
    }

    /// The message's name, for diagnostics.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello { .. } => "Hello",
            Msg::Challenge { .. } => "Challenge",
            Msg::Proof { .. } => "Proof",
            Msg::Welcome => "Welcome",
            Msg::Reject { .. } => "Reject",
            Msg::Contribute { .. } => "Contribute",
            Msg::Gathered { .. } => "Gathered",
            Msg::Abort { .. } => "Abort",
            Msg::Bye => "Bye",
        }
    }

    /// The whole frame, header included.
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::new();
        match self {
            Msg::Hello {
                rank,
                world,
                nonce,
                fingerprint,
                source,
            } => {
                p.extend_from_slice(&rank.to_le_bytes());
                p.extend_from_slice(&world.to_le_bytes());
                put_bytes(&mut p, nonce);
                put_bytes(&mut p, fingerprint.as_bytes());
                put_bytes(&mut p, source.as_bytes());
            }
            Msg::Challenge { nonce, mac } => {
                put_bytes(&mut p, nonce);
                put_bytes(&mut p, mac);
            }
            Msg::Proof {
                mac,
                pid,
                host,
                conflict,
            } => {
                put_bytes(&mut p, mac);
                p.extend_from_slice(&pid.to_le_bytes());
                put_bytes(&mut p, host.as_bytes());
                put_bytes(&mut p, conflict.as_bytes());
            }
            Msg::Welcome | Msg::Bye => {}
            Msg::Reject { reason } => put_bytes(&mut p, reason.as_bytes()),
            Msg::Contribute { seq, what, data } => {
                p.extend_from_slice(&seq.to_le_bytes());
                put_bytes(&mut p, what.as_bytes());
                put_bytes(&mut p, data);
            }
            Msg::Gathered { seq, parts } => {
                p.extend_from_slice(&seq.to_le_bytes());
                p.extend_from_slice(&(parts.len() as u32).to_le_bytes());
                for part in parts {
                    put_bytes(&mut p, part);
                }
            }
            Msg::Abort {
                origin,
                class,
                reason,
                missing,
                waited_ms,
            } => {
                p.extend_from_slice(&origin.to_le_bytes());
                p.push(match class {
                    AbortClass::Error => 0,
                    AbortClass::Exited => 1,
                    AbortClass::Timeout => 2,
                    AbortClass::Mismatch => 3,
                });
                put_bytes(&mut p, reason.as_bytes());
                p.extend_from_slice(&(missing.len() as u32).to_le_bytes());
                for m in missing {
                    p.extend_from_slice(&m.to_le_bytes());
                }
                p.extend_from_slice(&waited_ms.to_le_bytes());
            }
        }
        let mut frame = Vec::with_capacity(HEADER_LEN + p.len());
        frame.extend_from_slice(MAGIC);
        frame.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        frame.push(self.kind());
        frame.push(0);
        frame.extend_from_slice(&(p.len() as u32).to_le_bytes());
        frame.extend_from_slice(&p);
        frame
    }

    /// Checks a header and returns (kind, payload length).
    pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<(u8, usize), WireError> {
        if &h[0..4] != MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != WIRE_VERSION {
            return Err(WireError::Version(version));
        }
        let kind = h[6];
        if !(K_HELLO..=K_PROOF).contains(&kind) {
            return Err(WireError::Kind(kind));
        }
        if h[7] != 0 {
            return Err(WireError::Malformed("reserved header byte is not zero"));
        }
        let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(WireError::TooLong(len));
        }
        Ok((kind, len))
    }

    /// Decodes a payload of a known kind; every byte must be consumed.
    pub fn decode_payload(kind: u8, payload: &[u8]) -> Result<Msg, WireError> {
        let mut r = Reader(payload);
        let msg = match kind {
            K_HELLO => Msg::Hello {
                rank: r.u32()?,
                world: r.u32()?,
                nonce: r.bytes()?.to_vec(),
                fingerprint: r.string()?,
                source: r.string()?,
            },
            K_CHALLENGE => Msg::Challenge {
                nonce: r.bytes()?.to_vec(),
                mac: r.bytes()?.to_vec(),
            },
            K_PROOF => Msg::Proof {
                mac: r.bytes()?.to_vec(),
                pid: r.u32()?,
                host: r.string()?,
                conflict: r.string()?,
            },
            K_WELCOME => Msg::Welcome,
            K_REJECT => Msg::Reject {
                reason: r.string()?,
            },
            K_CONTRIBUTE => Msg::Contribute {
                seq: r.u64()?,
                what: r.string()?,
                data: r.bytes()?.to_vec(),
            },
            K_GATHERED => {
                let seq = r.u64()?;
                let n = r.u32()? as usize;
                // Each part costs at least its 4-byte length, which bounds n by the bytes held.
                if n > r.0.len() / 4 {
                    return Err(WireError::Malformed("part count exceeds frame"));
                }
                let mut parts = Vec::with_capacity(n);
                for _ in 0..n {
                    parts.push(r.bytes()?.to_vec());
                }
                Msg::Gathered { seq, parts }
            }
            K_ABORT => {
                let origin = r.u32()?;
                let class = match r.u8()? {
                    0 => AbortClass::Error,
                    1 => AbortClass::Exited,
                    2 => AbortClass::Timeout,
                    3 => AbortClass::Mismatch,
                    _ => return Err(WireError::Malformed("unknown abort class")),
                };
                let reason = r.string()?;
                let n = r.u32()? as usize;
                if n > r.0.len() / 4 {
                    return Err(WireError::Malformed("missing-PE count exceeds frame"));
                }
                let mut missing = Vec::with_capacity(n);
                for _ in 0..n {
                    missing.push(r.u32()?);
                }
                Msg::Abort {
                    origin,
                    class,
                    reason,
                    missing,
                    waited_ms: r.u64()?,
                }
            }
            K_BYE => Msg::Bye,
            k => return Err(WireError::Kind(k)),
        };
        if !r.0.is_empty() {
            return Err(WireError::Malformed("trailing bytes after message"));
        }
        Ok(msg)
    }

    /// Decodes one whole frame held in memory.
    pub fn decode(frame: &[u8]) -> Result<Msg, WireError> {
        if frame.len() < HEADER_LEN {
            return Err(WireError::Malformed("shorter than a header"));
        }
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&frame[..HEADER_LEN]);
        let (kind, len) = Msg::decode_header(&h)?;
        let payload = &frame[HEADER_LEN..];
        if payload.len() != len {
            return Err(WireError::Malformed("length field disagrees with frame"));
        }
        Msg::decode_payload(kind, payload)
    }

    /// Reads one frame from a stream.
    pub fn read_from(r: &mut impl Read) -> std::io::Result<Msg> {
        let mut h = [0u8; HEADER_LEN];
        r.read_exact(&mut h)?;
        let (kind, len) = Msg::decode_header(&h).map_err(invalid_data)?;
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload)?;
        Msg::decode_payload(kind, &payload).map_err(invalid_data)
    }

    /// Writes one frame to a stream.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.encode())?;
        w.flush()
    }
}

fn invalid_data(e: WireError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

fn put_bytes(p: &mut Vec<u8>, b: &[u8]) {
    p.extend_from_slice(&(b.len() as u32).to_le_bytes());
    p.extend_from_slice(b);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Malformed("field runs past the end of the frame"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, WireError> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| WireError::Malformed("string is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_msg() -> impl Strategy<Value = Msg> {
        let bytes = proptest::collection::vec(any::<u8>(), 0..64);
        prop_oneof![
            (
                any::<u32>(),
                any::<u32>(),
                bytes.clone(),
                ".{0,20}",
                ".{0,20}"
            )
                .prop_map(|(rank, world, nonce, fingerprint, source)| Msg::Hello {
                    rank,
                    world,
                    nonce,
                    fingerprint,
                    source,
                }),
            (bytes.clone(), bytes.clone()).prop_map(|(nonce, mac)| Msg::Challenge { nonce, mac }),
            (bytes.clone(), any::<u32>(), ".{0,20}", ".{0,20}").prop_map(
                |(mac, pid, host, conflict)| Msg::Proof {
                    mac,
                    pid,
                    host,
                    conflict
                }
            ),
            Just(Msg::Welcome),
            ".{0,40}".prop_map(|reason| Msg::Reject { reason }),
            (any::<u64>(), ".{0,20}", bytes.clone())
                .prop_map(|(seq, what, data)| Msg::Contribute { seq, what, data }),
            (any::<u64>(), proptest::collection::vec(bytes, 0..9))
                .prop_map(|(seq, parts)| Msg::Gathered { seq, parts }),
            (
                any::<u32>(),
                0u8..4,
                ".{0,40}",
                proptest::collection::vec(any::<u32>(), 0..9),
                any::<u64>()
            )
                .prop_map(|(origin, c, reason, missing, waited_ms)| Msg::Abort {
                    origin,
                    class: [
                        AbortClass::Error,
                        AbortClass::Exited,
                        AbortClass::Timeout,
                        AbortClass::Mismatch,
                    ][c as usize],
                    reason,
                    missing,
                    waited_ms,
                }),
            Just(Msg::Bye),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn round_trips(m in any_msg()) {
            prop_assert_eq!(Msg::decode(&m.encode()).unwrap(), m.clone());
            let mut cursor = std::io::Cursor::new(m.encode());
            prop_assert_eq!(Msg::read_from(&mut cursor).unwrap(), m);
        }

        /// Garbage never panics and never yields a message that re-encodes differently.
        #[test]
        fn garbage_is_rejected_or_consistent(g in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(m) = Msg::decode(&g) {
                prop_assert_eq!(m.encode(), g.clone());
            }
            let _ = Msg::read_from(&mut std::io::Cursor::new(g));
        }

        /// A valid frame with bytes flipped or cut is rejected or decodes to a self-consistent
        /// message; it never panics or over-allocates.
        #[test]
        fn mutated_frames(m in any_msg(), pos in any::<usize>(), val in any::<u8>(), cut in any::<usize>()) {
            let mut f = m.encode();
            let i = pos % f.len();
            f[i] = val;
            if let Ok(d) = Msg::decode(&f) {
                prop_assert_eq!(d.encode(), f.clone());
            }
            let c = cut % (f.len() + 1);
            let _ = Msg::decode(&f[..c]);
            let _ = Msg::read_from(&mut std::io::Cursor::new(&f[..c]));
        }
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let mut f = Msg::Bye.encode();
        f[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&f[..HEADER_LEN]);
        assert!(matches!(Msg::decode_header(&h), Err(WireError::TooLong(_))));
    }

    #[test]
    fn other_version_is_named() {
        let mut f = Msg::Welcome.encode();
        f[4] = 9;
        let e = Msg::decode(&f).unwrap_err();
        assert_eq!(e, WireError::Version(9));
        assert!(e.to_string().contains("version 9"));
    }

    #[test]
    fn huge_part_count_is_refused() {
        let mut p = Vec::new();
        p.extend_from_slice(&7u64.to_le_bytes());
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Msg::decode_payload(K_GATHERED, &p).is_err());
    }
}

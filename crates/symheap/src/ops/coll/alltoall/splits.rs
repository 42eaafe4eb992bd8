//! An alltoall's uneven blocks: how they are sized ([`Splits`]: split sizes on the host, or
//! counts in device memory), read from the parameters by name, and every member's sizes as
//! one matrix ([`Matrix`]) that says where each block starts and lands, checked the same way on
//! every member (pairs that disagree, counts past a buffer). The steps that move the blocks are
//! the kind's (`mod.rs`).

use super::super::params::{CollParam, Params};
use crate::backend::host::mpi::{Mpi, MpiComm};
use crate::context::Context;
use crate::element::DType;
use crate::error::{invalid, Error, ErrorKind, Result};

/// How an alltoall's blocks are sized. Sizes are in units of the request's `count` elements
/// (1 for the element forms; a row of a 2-D array for the Python and torch forms).
pub(crate) enum Splits {
    /// `count` elements to and from every member.
    Even,
    /// Units to each member (`send[j]`) and from each (`recv[j]`), given on the host.
    Host {
        send: Box<[usize]>,
        recv: Box<[usize]>,
    },
    /// Counts in device memory (see the module documentation).
    Device(DeviceSplits),
}

/// The buffers and sizes of an alltoall whose counts are in symmetric memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceSplits {
    /// n int64: rows this member sends each member.
    pub(crate) in_splits: u64,
    /// 2 × n int64, written: rows received from each member, and their start (rows).
    pub(crate) out: u64,
    /// Rows the source and the destination hold (the same on every member).
    pub(crate) src_rows: usize,
    pub(crate) dst_rows: usize,
}

impl Splits {
    /// The sizes from the parameters by name (see `AllToAll::from_params`).
    pub(super) fn from_params(p: &mut Params<'_>) -> Result<Splits> {
        let list = |p: &mut Params<'_>, name: &'static str| match p.get(name) {
            None => Ok(None),
            Some(CollParam::Ints(v)) => v
                .iter()
                .map(|&c| {
                    usize::try_from(c)
                        .map_err(|_| p.error(format!("{name} has a negative size, {c}")))
                })
                .collect::<Result<Box<[usize]>>>()
                .map(Some),
            Some(other) => {
                Err(p.error(format!("{name} must be a list of integers, not {other:?}")))
            }
        };
        let (send, recv) = (list(p, "send_counts")?, list(p, "recv_counts")?);
        let size = |p: &mut Params<'_>, name: &'static str| -> Result<Option<u64>> {
            match p.int(name)? {
                None => Ok(None),
                Some(v) => u64::try_from(v)
                    .map(Some)
                    .map_err(|_| p.error(format!("{name} must not be negative, it is {v}"))),
            }
        };
        let in_splits = size(p, "in_splits")?;
        let splits = match (send, recv, in_splits) {
            (None, None, None) => Splits::Even,
            (Some(send), Some(recv), None) => Splits::Host { send, recv },
            (None, None, Some(in_splits)) => {
                let need = |p: &mut Params<'_>, name| {
                    size(p, name)?.ok_or_else(|| p.error(format!("in_splits needs {name}")))
                };
                Splits::Device(DeviceSplits {
                    in_splits,
                    out: need(p, "out_splits_offsets")?,
                    src_rows: need(p, "src_rows")? as usize,
                    dst_rows: need(p, "dst_rows")? as usize,
                })
            }
            _ => {
                return Err(p.error(
                    "alltoall takes send_counts with recv_counts, or in_splits with \
                     out_splits_offsets, src_rows and dst_rows"
                        .into(),
                ))
            }
        };
        Ok(splits)
    }
}

/// `(offset, length)` in bytes, one per member.
type Ranges = Vec<(usize, usize)>;

/// Every member's sizes, as each member learned them: `rows[i]` is member i's send sizes.
pub(super) struct Matrix {
    rows: Vec<Vec<u64>>,
}

impl Matrix {
    /// Host splits: every member's send and receive sizes (`all[i] = send_i ++ recv_i`) as the
    /// matrix of sends, or the error naming the first pair that disagrees (member order, the
    /// same on every member).
    pub(super) fn agreed(
        cx: &Context,
        call: &'static str,
        all: &[Vec<u64>],
        count: usize,
    ) -> Result<Matrix> {
        let n = all.len();
        for i in 0..n {
            for (j, theirs) in all.iter().enumerate() {
                let (sent, expected) = (all[i][j], theirs[n + i]);
                if sent != expected {
                    let u = units(count);
                    return Err(invalid(
                        call,
                        format!(
                            "member {i} sends member {j} {sent} {u}, member {j} expects {expected} \
                             from member {i} (split sizes must agree pairwise)"
                        ),
                    )
                    .with_pe(cx.my_pe()));
                }
            }
        }
        let rows = all.iter().map(|r| r[..n].to_vec()).collect();
        Ok(Matrix { rows })
    }

    /// Device counts read on the host: every member's `in_splits` (`all[i]`), checked (no
    /// negative count, no member sending more than `src_rows` or receiving more than
    /// `dst_rows`, the same verdict on every member).
    pub(super) fn counted(
        cx: &Context,
        call: &'static str,
        all: &[Vec<i64>],
        d: &DeviceSplits,
    ) -> Result<Matrix> {
        let n = all.len();
        let bad = |why: String| Err(invalid(call, why).with_pe(cx.my_pe()));
        let mut rows = Vec::with_capacity(n);
        for (i, r) in all.iter().enumerate() {
            if let Some((j, c)) = r.iter().enumerate().find(|(_, &c)| c < 0) {
                return bad(format!(
                    "member {i} sends member {j} a negative count, {c} rows"
                ));
            }
            let total: u128 = r.iter().map(|&c| c as u128).sum();
            if total > d.src_rows as u128 {
                return bad(format!(
                    "member {i} sends {total} rows, its source holds {}",
                    d.src_rows
                ));
            }
            rows.push(r.iter().map(|&c| c as u64).collect::<Vec<u64>>());
        }
        for j in 0..n {
            let total: u128 = rows.iter().map(|r| r[j] as u128).sum();
            if total > d.dst_rows as u128 {
                return bad(format!(
                    "member {j} receives {total} rows, its destination holds {}",
                    d.dst_rows
                ));
            }
        }
        Ok(Matrix { rows })
    }

    /// The received rows and their starts for member `me` (all_to_all_vdev's
    /// `out_splits_offsets`), as bytes.
    pub(super) fn outputs(&self, me: usize) -> Vec<u8> {
        let n = self.rows.len();
        let mut out: Vec<i64> = (0..n).map(|i| self.rows[i][me] as i64).collect();
        out.extend((0..n).map(|i| self.landing(i, me) as i64));
        bytemuck::cast_slice(&out).to_vec()
    }

    /// Where member `i`'s block for member `j` starts in its source, and its length (units).
    pub(super) fn sent(&self, i: usize, j: usize) -> (u64, u64) {
        (self.rows[i][..j].iter().sum(), self.rows[i][j])
    }

    /// Where the block from member `i` starts in member `j`'s destination (units).
    pub(super) fn landing(&self, i: usize, j: usize) -> u64 {
        (0..i).map(|k| self.rows[k][j]).sum()
    }

    /// `(offset, length)` ranges of member `me`'s sends and receives, in bytes of `unit`.
    pub(super) fn ranges(&self, me: usize, unit: u64) -> (Ranges, Ranges) {
        let n = self.rows.len();
        let b = |u: u64| (u * unit) as usize;
        let send = (0..n).map(|j| self.sent(me, j)).map(|(o, l)| (b(o), b(l)));
        let recv = (0..n).map(|i| (b(self.landing(i, me)), b(self.rows[i][me])));
        (send.collect(), recv.collect())
    }
}

/// What sizes in units of `count` elements are called in messages.
fn units(count: usize) -> &'static str {
    if count == 1 {
        "elements"
    } else {
        "rows"
    }
}

/// This member's sizes as it tells the others: its send sizes, then its receive sizes.
pub(super) fn mine(send: &[usize], recv: &[usize]) -> Vec<u64> {
    send.iter().chain(recv).map(|&c| c as u64).collect()
}

/// Reads `n` int64 counts at `addr` (any PE's address on this host).
pub(super) fn read_counts(cx: &Context, addr: u64, n: usize) -> Result<Vec<i64>> {
    let mut c = vec![0i64; n];
    cx.inner
        .backend
        .read_bytes(addr, bytemuck::cast_slice_mut(&mut c))?;
    Ok(c)
}

/// The counts buffers of a device-counts call: symmetric, 8-byte aligned, `n` and `2 n`
/// int64 long.
pub(super) fn check_counts(
    cx: &Context,
    call: &'static str,
    d: &DeviceSplits,
    n: usize,
) -> Result<()> {
    for (what, addr, len) in [
        ("in_splits", d.in_splits, n),
        ("out_splits_offsets", d.out, 2 * n),
    ] {
        cx.inner.aligned(call, what, addr, DType::I64)?;
        cx.inner
            .own_offset(addr, 8 * len as u64, call)
            .map_err(|e| invalid(call, format!("{what}: {}", e.kind())).with_pe(cx.my_pe()))?;
    }
    Ok(())
}

/// Where `addr` lies in this PE's heap, for the ledger.
pub(super) fn heap_at(cx: &Context, addr: u64) -> String {
    let base = cx.inner.mem.own_base;
    match addr.checked_sub(base) {
        Some(off) if off < cx.inner.backend.mapped() => format!("heap+{off:#x}"),
        _ => "local memory".to_string(),
    }
}

/// Exclusive prefix sums of `v`.
pub(super) fn prefix(v: &[usize]) -> Vec<u64> {
    let mut acc = 0u64;
    v.iter()
        .map(|&c| {
            let o = acc;
            acc += c as u64;
            o
        })
        .collect()
}

/// `mine` (the same length on every member) from every member of `comm` (`n` of them).
pub(super) fn gather_u64(
    mpi: &Mpi,
    comm: MpiComm,
    mine: &[u64],
    n: usize,
) -> std::result::Result<Vec<Vec<u64>>, String> {
    let mut all = vec![0u64; mine.len() * n];
    let bytes = std::mem::size_of_val(mine);
    mpi.all_gather(comm, all.as_mut_ptr() as u64, mine.as_ptr() as u64, bytes)?;
    Ok(all.chunks(mine.len().max(1)).map(<[u64]>::to_vec).collect())
}

/// The error of split sizes too many to publish with a barrier's arrival.
pub(super) fn too_many(cx: &Context, call: &'static str, n: usize) -> Error {
    Error::new(
        Some(cx.my_pe()),
        call,
        ErrorKind::Unsupported(format!(
            "split sizes for a team of {n} (at most {} members on one node)",
            crate::context::area::PAYLOAD / 16
        )),
    )
}

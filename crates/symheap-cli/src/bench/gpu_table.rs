//! The GPU sweep's tables: symheap against every peer measured in the same run. The peer in the
//! bench PEs (NCCL through `symheap::tools::Nccl`) fills `peer_*` of each row; the peers measured by
//! their own programs in the same suite (`bench/*.py`: torch SymmetricMemory, NCCL by path with
//! symmetric windows and copy-engine collectives, NVSHMEM, FlashInfer) come as JSON lists of
//! `{"op", "bytes", "name", "us", "eager_us"?}` (`us`: CUDA-graph replay; `eager_us`: eager
//! launches, when measured) and are merged by op and size. Each table has a column per peer,
//! the best peer per row and the ratio `best peer time / symheap time` (above 1: symheap faster).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::gpu_time::GpuRow;

/// One number from a peer program.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerRow {
    /// The operation as symheap names it (`all_reduce`, `all_gather`, `put`, ...).
    pub op: String,
    /// Size under symheap's convention (NCCL-tests': the larger of send and receive buffers).
    pub bytes: u64,
    /// The peer, with its version (`NCCL 2.28.9 symmetric window`).
    pub name: String,
    /// Microseconds per op, CUDA-graph replay (eager for `rma`/`alloc` rows, which have no graph).
    pub us: f64,
    /// Microseconds per op, eager launches, when the peer measured them.
    #[serde(default)]
    pub eager_us: Option<f64>,
}

/// Reads one peer program's JSON list.
pub fn load_peers(path: &Path) -> Result<Vec<PeerRow>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Whether the peer number `p` is for symheap's row `r`: same size, and `r.op` is `p.op` or
/// `p.op` followed by a variant (`put` matches `put SM`, not `put+signal ...`).
fn matches(r: &GpuRow, p: &PeerRow) -> bool {
    r.bytes == p.bytes
        && (r.op == p.op
            || r.op
                .strip_prefix(p.op.as_str())
                .is_some_and(|rest| rest.starts_with(' ')))
}

/// Merges `peers` into `rows`; returns the numbers that have no symheap row (e.g. put/get at one
/// PE, where symheap measures no RMA), so that they are still printed.
pub fn merge_peers(rows: &mut [GpuRow], peers: Vec<PeerRow>) -> Vec<PeerRow> {
    let mut unmatched = Vec::new();
    for p in peers {
        let mut hit = false;
        for r in rows.iter_mut().filter(|r| matches(r, &p)) {
            hit = true;
            if r.group == "alloc" {
                r.peer_eager_us = Some(p.us);
                r.peer = p.name.clone();
                continue;
            }
            if !r.others.iter().any(|(n, _)| *n == p.name) {
                r.others.push((p.name.clone(), p.us));
                if let Some(e) = p.eager_us {
                    r.others_eager.push((p.name.clone(), e));
                }
            }
        }
        if !hit {
            unmatched.push(p);
        }
    }
    unmatched
}

/// The fastest peer of a row, CUDA-graph numbers (eager for RMA rows): the in-process peer and
/// every merged one; `None` when no peer was measured.
pub fn best_peer(r: &GpuRow) -> Option<(String, f64)> {
    let own = if r.group == "coll" {
        r.peer_graph_us
    } else {
        r.peer_eager_us
    };
    fastest(own.map(|t| (r.peer.as_str(), t)), &r.others)
}

/// The fastest peer of a collective row launched eagerly.
pub fn best_peer_eager(r: &GpuRow) -> Option<(String, f64)> {
    fastest(
        r.peer_eager_us.map(|t| (r.peer.as_str(), t)),
        &r.others_eager,
    )
}

fn fastest(own: Option<(&str, f64)>, others: &[(String, f64)]) -> Option<(String, f64)> {
    own.into_iter()
        .chain(others.iter().map(|(n, t)| (n.as_str(), *t)))
        .filter(|(_, t)| t.is_finite() && *t > 0.0)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(n, t)| (n.to_string(), t))
}

fn us(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

/// `peer / ours` as `1.23x`, or `-`.
pub fn ratio(peer: Option<f64>, ours: Option<f64>) -> String {
    match (peer, ours) {
        (Some(p), Some(o)) if o > 0.0 => format!("{:.2}x", p / o),
        _ => "-".into(),
    }
}

fn busbw(r: &GpuRow, t: Option<f64>) -> String {
    match t {
        Some(t) if r.bus_factor > 0.0 && t > 0.0 => {
            format!("{:.1}", r.bus_factor * r.bytes as f64 / (t * 1e-6) / 1e9)
        }
        _ => "-".into(),
    }
}

/// Every merged peer name over `rows`, in order of first appearance.
fn other_names<'a>(rows: impl Iterator<Item = &'a GpuRow>) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in rows {
        for (n, _) in &r.others {
            if !v.contains(n) {
                v.push(n.clone());
            }
        }
    }
    v
}

/// The collective table: symheap, one column per peer (graph), the best peer and the ratio,
/// graph and eager, and the bus bandwidths.
fn print_coll(coll: &[&GpuRow]) {
    let own: Vec<String> = {
        let mut v: Vec<String> = coll.iter().map(|r| r.peer.clone()).collect();
        v.dedup();
        v
    };
    let others = other_names(coll.iter().copied());
    let mut head = String::from("| op | dtype | size | symheap graph us |");
    for n in own.iter().chain(&others) {
        head.push_str(&format!(" {n} graph us |"));
    }
    head.push_str(
        " best peer (graph) | best peer graph us | best peer/symheap (graph) | symheap eager us \
         | best peer (eager) | best peer/symheap (eager) | symheap busbw GB/s | best peer busbw GB/s |",
    );
    println!("{head}");
    println!("|{}", "---|".repeat(head.matches(" |").count()));
    for r in coll {
        let mut line = format!(
            "| {} | {} | {} | {} |",
            r.op,
            r.dtype,
            symheap::human_bytes(r.bytes),
            us(r.graph_us)
        );
        for n in &own {
            let v = if *n == r.peer { r.peer_graph_us } else { None };
            line.push_str(&format!(" {} |", us(v)));
        }
        for n in &others {
            let v = r.others.iter().find(|(m, _)| m == n).map(|(_, v)| *v);
            line.push_str(&format!(" {} |", us(v)));
        }
        let best = best_peer(r);
        let best_e = best_peer_eager(r);
        line.push_str(&format!(
            " {} | {} | {} | {} | {} | {} | {} | {} |",
            best.as_ref().map(|b| b.0.as_str()).unwrap_or("-"),
            us(best.as_ref().map(|b| b.1)),
            ratio(best.as_ref().map(|b| b.1), r.graph_us),
            us(r.eager_us),
            best_e
                .as_ref()
                .map(|b| format!("{} {:.2} us", b.0, b.1))
                .unwrap_or_else(|| "-".into()),
            ratio(best_e.as_ref().map(|b| b.1), r.eager_us),
            busbw(r, r.graph_us),
            busbw(r, best.as_ref().map(|b| b.1)),
        ));
        println!("{line}");
    }
}

/// The RMA and allocation table: the in-process peer, the merged ones, the best and the ratio.
fn print_rma(rma: &[&GpuRow]) {
    println!(
        "\n| op | size | symheap us | symheap GB/s | peer | peer us | other peers us | best peer \
         | best peer GB/s | best peer/symheap |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rma {
        let gbps = |t: Option<f64>| match t {
            Some(t) if r.bus_factor > 0.0 && t > 0.0 => {
                format!("{:.1}", r.bytes as f64 / (t * 1e-6) / 1e9)
            }
            _ => "-".into(),
        };
        let others = if r.others.is_empty() {
            "-".to_string()
        } else {
            r.others
                .iter()
                .map(|(n, t)| format!("{n}: {t:.2}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let best = best_peer(r);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.op,
            symheap::human_bytes(r.bytes),
            us(r.eager_us),
            gbps(r.eager_us),
            r.peer,
            us(r.peer_eager_us),
            others,
            best.as_ref().map(|b| b.0.as_str()).unwrap_or("-"),
            gbps(best.as_ref().map(|b| b.1)),
            ratio(best.as_ref().map(|b| b.1), r.eager_us)
        );
    }
}

/// Prints the tables (markdown), then the peer numbers that have no symheap row.
pub fn print_tables(title: &str, rows: &[GpuRow], unmatched: &[PeerRow]) {
    println!("\n{title}\n");
    let coll: Vec<&GpuRow> = rows.iter().filter(|r| r.group == "coll").collect();
    if !coll.is_empty() {
        print_coll(&coll);
    }
    let rma: Vec<&GpuRow> = rows.iter().filter(|r| r.group != "coll").collect();
    if !rma.is_empty() {
        print_rma(&rma);
    }
    if !unmatched.is_empty() {
        println!(
            "\nPeers measured in this run with no symheap row to compare (e.g. put/get at 1 PE):\n"
        );
        println!("| peer | op | size | graph us | eager us |");
        println!("|---|---|---|---|---|");
        for p in unmatched {
            println!(
                "| {} | {} | {} | {:.2} | {} |",
                p.name,
                p.op,
                symheap::human_bytes(p.bytes),
                p.us,
                us(p.eager_us)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coll(op: &str, bytes: u64, graph: f64, nccl: f64) -> GpuRow {
        GpuRow {
            group: "coll".into(),
            op: op.into(),
            dtype: "bf16".into(),
            bytes,
            graph_us: Some(graph),
            eager_us: Some(graph * 2.0),
            peer: "NCCL 2.28.3".into(),
            peer_graph_us: Some(nccl),
            peer_eager_us: Some(nccl * 2.0),
            bus_factor: 1.0,
            ..Default::default()
        }
    }

    fn peer(op: &str, bytes: u64, name: &str, us: f64, eager: Option<f64>) -> PeerRow {
        PeerRow {
            op: op.into(),
            bytes,
            name: name.into(),
            us,
            eager_us: eager,
        }
    }

    #[test]
    fn peers_of_several_files_merge_by_op_and_size_and_the_fastest_is_the_best() {
        let mut rows = vec![
            coll("all_reduce", 8192, 5.0, 11.0),
            coll("all_reduce", 65536, 6.0, 12.0),
            coll("all_gather", 8192, 4.0, 9.0),
        ];
        // Two "files", as two peer programs write them.
        let torch = vec![
            peer("all_reduce", 8192, "torch symm_mem one_shot", 6.4, None),
            peer("all_reduce", 65536, "torch symm_mem one_shot", 6.7, None),
        ];
        let nccl = vec![
            peer("all_reduce", 8192, "NCCL 2.32.3 symmetric", 4.5, Some(9.0)),
            peer("all_gather", 8192, "NCCL 2.32.3 symmetric", 10.0, Some(8.5)),
            // A size symheap did not run: kept aside, not lost.
            peer("all_gather", 1 << 20, "NCCL 2.32.3 symmetric", 20.0, None),
        ];
        assert!(merge_peers(&mut rows, torch).is_empty());
        let left = merge_peers(&mut rows, nccl);
        assert_eq!(
            left,
            vec![peer(
                "all_gather",
                1 << 20,
                "NCCL 2.32.3 symmetric",
                20.0,
                None
            )]
        );
        assert_eq!(rows[0].others.len(), 2);
        // Graph: the merged NCCL 2.32 (4.5) beats torch (6.4) and the in-process NCCL (11).
        assert_eq!(
            best_peer(&rows[0]),
            Some(("NCCL 2.32.3 symmetric".to_string(), 4.5))
        );
        assert_eq!(
            ratio(best_peer(&rows[0]).map(|b| b.1), rows[0].graph_us),
            "0.90x"
        );
        // Eager: only the peers that measured eager take part (NCCL 2.28 at 22, 2.32 at 9).
        assert_eq!(
            best_peer_eager(&rows[0]),
            Some(("NCCL 2.32.3 symmetric".to_string(), 9.0))
        );
        // torch is best at 64 KiB; the in-process NCCL at all_gather 8 KiB.
        assert_eq!(best_peer(&rows[1]).unwrap().0, "torch symm_mem one_shot");
        assert_eq!(best_peer(&rows[2]), Some(("NCCL 2.28.3".to_string(), 9.0)));
        assert_eq!(best_peer_eager(&rows[2]).unwrap().1, 8.5);
    }

    #[test]
    fn a_name_merges_once_and_variants_match_on_a_word_boundary() {
        let rma = |op: &str| GpuRow {
            group: "rma".into(),
            op: op.into(),
            bytes: 4096,
            eager_us: Some(2.0),
            peer: "plain P2P copy".into(),
            peer_eager_us: Some(3.0),
            ..Default::default()
        };
        let mut rows = vec![
            rma("put SM"),
            rma("put copy engine"),
            rma("put+signal one-way latency (ping-pong / 2)"),
        ];
        let p = peer("put", 4096, "NVSHMEM 3.4.5 put_on_stream", 1.5, None);
        let left = merge_peers(&mut rows, vec![p.clone(), p]);
        assert!(left.is_empty());
        assert_eq!(rows[0].others.len(), 1);
        assert_eq!(rows[1].others.len(), 1);
        assert!(rows[2].others.is_empty());
        // RMA rows compare eager times: the in-process peer is 3.0, NVSHMEM 1.5.
        assert_eq!(best_peer(&rows[0]).unwrap().1, 1.5);
    }

    #[test]
    fn alloc_rows_take_the_peer_in_place_and_no_peer_means_no_best() {
        let mut rows = vec![GpuRow {
            group: "alloc".into(),
            op: "allocate_symmetric 1 MiB (median of 300)".into(),
            bytes: 1 << 20,
            eager_us: Some(20.0),
            peer: "torch SymmetricMemory empty+rendezvous".into(),
            ..Default::default()
        }];
        assert_eq!(best_peer(&rows[0]), None);
        let p = peer(
            "allocate_symmetric",
            1 << 20,
            "torch 2.11 empty+rendezvous",
            3200.0,
            None,
        );
        assert!(merge_peers(&mut rows, vec![p]).is_empty());
        assert_eq!(rows[0].peer, "torch 2.11 empty+rendezvous");
        assert_eq!(
            best_peer(&rows[0]),
            Some(("torch 2.11 empty+rendezvous".to_string(), 3200.0))
        );
        // A non-finite or zero time is never "best".
        let mut r = coll("broadcast", 8192, 1.0, 0.0);
        r.others.push(("x".into(), f64::NAN));
        assert_eq!(best_peer(&r), None);
    }

    #[test]
    fn the_tables_print_every_kind_of_row() {
        let mut rows = vec![
            coll("all_reduce", 8192, 5.0, 11.0),
            coll("alltoall", 8192, 5.0, 11.0),
        ];
        rows.push(GpuRow {
            group: "rma".into(),
            op: "put SM".into(),
            bytes: 4096,
            eager_us: Some(2.0),
            peer: "plain P2P copy".into(),
            peer_eager_us: Some(3.0),
            bus_factor: 1.0,
            ..Default::default()
        });
        let left = merge_peers(
            &mut rows,
            vec![
                peer(
                    "all_reduce",
                    8192,
                    "FlashInfer 0.7.2 trtllm one-shot",
                    4.0,
                    Some(7.0),
                ),
                peer(
                    "put",
                    4096,
                    "NVSHMEM 3.4.5 putmem_on_stream",
                    1.0,
                    Some(1.0),
                ),
                peer(
                    "get",
                    1 << 20,
                    "NVSHMEM 3.4.5 getmem_on_stream",
                    9.0,
                    Some(9.0),
                ),
            ],
        );
        assert_eq!(left.len(), 1);
        print_tables("test", &rows, &left);
    }
}

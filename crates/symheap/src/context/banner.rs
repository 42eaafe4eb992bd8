//! The diagnostic banner printed by `symheap info` and by `SYMHEAP_DEBUG=info` at init.

use std::fmt::Write;

use super::Inner;
use crate::util::human_bytes;

pub(crate) fn render(c: &Inner) -> String {
    let mut s = String::new();
    let be = &c.backend;
    let _ = writeln!(
        s,
        "symheap {} | PE {} of {} | launcher: {}",
        env!("CARGO_PKG_VERSION"),
        c.rank,
        c.world,
        c.launcher.name()
    );
    let _ = writeln!(s, "  backend   : {} ({})", be.kind().name(), be.describe());
    if let Some(cu) = be.as_cuda() {
        let _ = writeln!(
            s,
            "  protocols : LL, flag, two-shot; {}",
            cu.protocols().why
        );
    }
    let _ = writeln!(
        s,
        "  node      : {} of {} ({}), local rank {} of {}",
        c.node.node_index,
        c.node.node_count,
        c.node.node_id,
        c.node.local_rank,
        c.node.local_size()
    );
    let bases: Vec<u64> = (0..c.world)
        .map(|pe| be.slot_base(pe).unwrap_or(0))
        .collect();
    let own = bases[c.rank];
    let _ = writeln!(
        s,
        "  heap      : capacity {} per PE, chunk {}, mapped {} in {} chunk(s); PE r's heap at {:#x} + (r - {}) x {}",
        human_bytes(be.capacity()),
        human_bytes(c.cfg.chunk_size),
        human_bytes(be.mapped()),
        be.chunks().len(),
        own,
        c.rank,
        human_bytes(be.capacity()),
    );
    let direct: Vec<String> = (0..c.world)
        .filter(|&pe| bases[pe] != 0)
        .map(|pe| pe.to_string())
        .collect();
    let _ = writeln!(s, "  direct    : PEs {}", compress(&direct));
    let _ = writeln!(s, "  rendezvous: {}", c.rendezvous);
    let _ = writeln!(
        s,
        "  timeout   : {:.1} s | rendezvous token: {}",
        c.cfg.timeout.as_secs_f64(),
        c.token_source
    );
    if let Some(p) = c.init_phases.get() {
        let _ = write!(s, "  init      : {}", p.render());
        if let Some(cu) = be.as_cuda() {
            let _ = write!(s, "; backend: {}", cu.init_breakdown());
        }
        let _ = writeln!(s);
    }
    if c.cfg.env_read.is_empty() {
        let _ = write!(s, "  environment: (no symheap or launcher variables set)");
    } else {
        let vars: Vec<String> = c
            .cfg
            .env_read
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = write!(s, "  environment: {}", vars.join(" "));
    }
    s
}

/// "0 1 2 3 5" -> "0-3, 5".
fn compress(pes: &[String]) -> String {
    let nums: Vec<usize> = pes.iter().filter_map(|p| p.parse().ok()).collect();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nums.len() {
        let mut j = i;
        while j + 1 < nums.len() && nums[j + 1] == nums[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", nums[i], nums[j])
        } else {
            nums[i].to_string()
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

//! Every PE writes into every peer's copy of one symmetric buffer through the peer table, then
//! checks what it received. Run: `symheap launch -n 4 -- target/debug/examples/peer_write`.

use symheap::Context;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::init()?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    // One u64 slot per writer in every PE's copy.
    let (buf, peer_bases) = ctx.allocate_symmetric::<u64>(n)?;
    assert_eq!(peer_bases[me], buf.addr());
    buf.write(0, &vec![u64::MAX; n])?;
    ctx.barrier_all()?; // peers may write only after a barrier

    for (peer, &base) in peer_bases.iter().enumerate() {
        if base != 0 {
            // Slot `me` of PE `peer`'s copy, addressed through the table.
            ctx.write_at(base + 8 * me as u64, &[(me * 1000 + peer) as u64])?;
        }
    }
    ctx.barrier_all()?;

    let got = buf.to_vec::<u64>()?;
    for (writer, &v) in got.iter().enumerate() {
        if v != (writer * 1000 + me) as u64 {
            return Err(format!(
                "PE {me}: slot {writer} holds {v}, expected {}",
                writer * 1000 + me
            )
            .into());
        }
    }
    println!("PE {me} of {n}: received {got:?} from every peer: ok");
    ctx.finalize()?;
    Ok(())
}

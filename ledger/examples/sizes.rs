//! What a sled ledger's records weigh, beside the folder's size on disk:
//! `cargo run --release -p ledger --example sizes -- PATH` (a closed ledger's folder).
//! Prints, for each record kind (the first byte of its sled key), how many there are and
//! their key and value bytes, then the bytes per fact of the records and of sled's file,
//! so the store's own layout and sled's space amplification can be told apart.

use std::collections::BTreeMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: sizes PATH (a closed ledger's folder)")?;
    let db = sled::Config::new().path(&path).open()?;
    let tree = db.open_tree("ledger")?;
    let mut kinds = BTreeMap::<u8, (u64, u64, u64)>::new();
    for item in tree.iter() {
        let (k, v) = item?;
        let e = kinds.entry(k.first().copied().unwrap_or(0)).or_default();
        e.0 += 1;
        e.1 += k.len() as u64;
        e.2 += v.len() as u64;
    }
    // A fact record ('f') holds one fact or a block of a group's facts; every fact has
    // exactly one key record ('k').
    let facts = kinds.get(&b'k').map_or(0, |e| e.0).max(1);
    let mut live = 0;
    println!("| kind | records | key bytes | value bytes |");
    println!("|---|---:|---:|---:|");
    for (kind, (n, k, v)) in &kinds {
        live += k + v;
        println!("| {} | {n} | {k} | {v} |", char::from(*kind));
    }
    let file = db.size_on_disk()?;
    println!(
        "{facts} facts: records {:.0} bytes per fact, sled's file {:.0} bytes per fact ({:.1}x)",
        live as f64 / facts as f64,
        file as f64 / facts as f64,
        file as f64 / live.max(1) as f64
    );
    Ok(())
}

//! Fills a ledger folder with many facts, to try the worker and the dashboard at scale:
//! `cargo run --release -p ledger --example fill -- PATH [FACTS] [ACCOUNTS]`
//! (defaults: 1,000,000 facts over 1,000 accounts; a few percent of the withdrawals are
//! overdrafts, so rejections show up too).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ledger::{Account, Amount, ClientId, Command, Currency, Key, SledConfig, SledStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: fill PATH [FACTS] [ACCOUNTS]")?;
    let facts: u64 = args
        .next()
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let accounts: u64 = args.next().map(|v| v.parse()).transpose()?.unwrap_or(1_000);
    let (ledger, report) = SledStore::open(SledConfig::new(&path))?;
    println!("{report}");
    let rub = Currency::parse("RUB")?;
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..64)
        .map(|_| {
            let (ledger, next) = (ledger.clone(), next.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let client = ClientId::default_client();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= facts {
                        return Ok(());
                    }
                    let account = Account::parse(&format!("acct{}", n % accounts))
                        .map_err(|e| e.to_string())?;
                    // Every account gets a deposit first, then withdrawals of 1..=97.
                    let command = if n < accounts {
                        Command::Deposit {
                            account,
                            amount: Amount::new(100_000).map_err(|e| e.to_string())?,
                            currency: rub,
                        }
                    } else {
                        Command::Withdraw {
                            account,
                            amount: Amount::new(n % 97 + 1).map_err(|e| e.to_string())?,
                            currency: rub,
                        }
                    };
                    let key = Key::parse(&format!("ord-{n:08}")).map_err(|e| e.to_string())?;
                    ledger
                        .blocking()
                        .submit(&client, &key, command)
                        .map_err(|e| e.to_string())?;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "a filler thread panicked")??;
    }
    let stats = ledger.blocking().stats();
    println!(
        "{} facts in {:.1} s; {} applied, {} rejected",
        stats.last_seq,
        started.elapsed().as_secs_f64(),
        stats.applied_total(),
        stats.rejected_total()
    );
    ledger.blocking().shutdown();
    Ok(())
}

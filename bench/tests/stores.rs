//! `idem-bench stores`: a short run against the sled worker only (no PostgreSQL needed),
//! checking the table, the effects cross-check and the plot.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn bench_on_sled_writes_a_table_and_a_plot() {
    // The bench starts the worker it finds next to itself, as an installed pair would.
    worker_beside_the_bench();
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .args(["stores", "--targets", "sled", "--concurrency", "2"])
        .args(["--duration", "1s", "--accounts", "10", "--out"])
        .arg(out_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    let table = std::fs::read_to_string(out_dir.path().join("table.md")).unwrap();
    assert!(
        stdout.contains(&table),
        "the table is printed too:\n{stdout}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("| sled | 2 |"))
        .unwrap_or_else(|| panic!("no sled row in\n{table}"));
    // | target | conc | throughput/s | effects/s | p50 ms | p99 ms | effects | store applied |
    //   CPU measured | CPU other | note |
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    let throughput: f64 = cells[3].parse().unwrap();
    let effects: u64 = cells[7].parse().unwrap();
    let applied: u64 = cells[8].parse().unwrap();
    assert!(throughput > 0.0, "{row}");
    assert!(effects > 0, "{row}");
    assert_eq!(
        effects, applied,
        "the load's count against the worker's: {row}"
    );
    assert_eq!(cells[11], "", "no note expected: {row}");

    let results: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.path().join("results.json")).unwrap(),
    )
    .unwrap();
    let point = &results["points"][0];
    assert_eq!(point["target"], "sled");
    assert_eq!(point["measured"]["effects"], point["measured"]["applied"]);
    assert_eq!(point["measured"]["keys"], point["measured"]["effects"]);

    let svg = std::fs::read_to_string(out_dir.path().join("throughput.svg")).unwrap();
    let svg = svg.trim();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{}",
        &svg[..svg.len().min(200)]
    );
    assert!(svg.contains("<svg") && svg.ends_with("</svg>"));
    assert!(
        svg.contains(">\nsled\n<") || svg.contains(">sled<"),
        "a legend entry for sled"
    );
}

/// The worker binary sits next to idem-bench in the same target folder. `cargo test
/// --workspace` builds it (the worker's own tests need it); when only this package was
/// built it is built here.
fn worker_beside_the_bench() {
    let bench = Path::new(env!("CARGO_BIN_EXE_idem-bench"));
    let dir = bench.parent().unwrap();
    let bin = dir.join(format!("inbox-worker{}", std::env::consts::EXE_SUFFIX));
    if bin.exists() {
        return;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "inbox-worker", "--bin", "inbox-worker"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            build.arg("--release");
        }
        Some(profile) => {
            build.args(["--profile", profile]);
        }
    }
    let status = build.status().unwrap();
    assert!(status.success(), "building inbox-worker failed: {status}");
    assert!(
        bin.exists(),
        "built inbox-worker, but it is not next to idem-bench at {}",
        bin.display()
    );
}

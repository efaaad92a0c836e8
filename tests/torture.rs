//! The crash torture's short mode: a few `kill -9` cycles under mixed load,
//! every acknowledged effect checked after each restart (`marmot bench
//! torture`; `scripts/torture` runs 1,000 cycles on a release build).

use std::process::Command;

#[test]
fn a_short_crash_torture_loses_nothing_acknowledged_and_applies_nothing_twice() {
    let out = Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["bench", "torture", "--cycles", "8", "--connections", "8"])
        .output()
        .expect("run marmot bench torture");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "torture failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("cycle 8:") && stdout.contains("0 acknowledged effects lost"),
        "{stdout}"
    );
    // It did real work: every kind of operation was acknowledged.
    for kind in [
        "message", "queued", "alarm", "hook", "send", "input", "emit",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(kind))
            .unwrap_or_else(|| panic!("no {kind} line in:\n{stdout}"));
        let acked: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(acked > 0, "no {kind} acknowledged:\n{stdout}");
    }
}

//! Tests that change something of the whole process (a kernel flag, a
//! resource limit) run again alone in a child of the test binary, so that
//! the binary's other tests keep the process as it was.

/// Run `test` alone in a child of this test binary, with each variable of
/// `env` set (`Some`) or removed (`None`); fail unless the child ran that
/// one test and it passed.
pub(crate) fn rerun(test: &str, env: &[(&str, Option<&str>)]) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture"]);
    for (key, value) in env {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The child ran the test, not zero tests through a wrong filter.
    assert!(stdout.contains("1 passed"), "child output: {stdout}");
}

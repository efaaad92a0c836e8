//! Builds the example and test actors for `wasm32-wasip2`.
//!
//! `marmot dev` embeds the examples so trying Marmot is one command, and the
//! integration tests deploy the test guests. Each guest becomes a
//! `MARMOT_GUEST_<NAME>` constant pointing at its `.wasm` file, so a guest
//! that fails to build fails the host build rather than a test at run time.
//!
//! The guests are built by a nested cargo with its own target directory
//! (`target/wasm-guests`) so it never waits on the outer build's lock.
//!
//! The JavaScript engine (`actors/quickjs`) embeds QuickJS, which is C: it
//! needs clang, llvm-ar and a wasm32-wasi libc sysroot. On Debian/Ubuntu
//! those are the packages `clang llvm wasi-libc` (the README's scripts
//! install them). Set `CC_wasm32_wasip2`, `AR_wasm32_wasip2` and
//! `CFLAGS_wasm32_wasip2` to use another toolchain.

use std::path::{Path, PathBuf};
use std::process::Command;

const GUESTS: &[(&str, &str)] = &[
    ("counter", "examples/counter"),
    ("notes", "examples/notes"),
    ("marmot-testkit", "tests/guests/testkit"),
    ("marmot-spinning-origin", "tests/guests/spinning-origin"),
    ("marmot-quickjs", "actors/quickjs"),
    ("marmot-agent", "actors/agent"),
];

/// Defines for QuickJS's C. quickjs-ng serves allocations up to 512 bytes
/// from 4 KiB arenas, one per size class, and turns them off only where
/// `__SANITIZE_ADDRESS__` is defined (its one other use in the sources is
/// compiled out). Without them a sandbox's allocations come from wasi-libc's
/// malloc, packed together instead of spread over one page per size class:
/// fewer of the shared snapshot's pages are copied into each sandbox
/// (`marmot bench js-rss`: 296 → 257 KB of PSS per active JavaScript actor).
const QUICKJS_DEFINES: &str = "-D__SANITIZE_ADDRESS__";

/// Where Debian's `wasi-libc` package puts the sysroot headers.
const DEBIAN_WASI_INCLUDE: &str = "/usr/include/wasm32-wasi";

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for dir in ["wit", "guest-sdk", "vendor", "Cargo.lock", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for (_, dir) in GUESTS {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("wasm-guests");
    check_target_installed();
    let c_env = c_toolchain();

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--target", "wasm32-wasip2", "--profile", "guest"])
        .arg("--target-dir")
        .arg(&target_dir);
    for (name, _) in GUESTS {
        cmd.args(["-p", name]);
    }
    // The outer build's flags and wrappers (clippy, coverage) are for the
    // host; the guests get a plain build.
    // rquickjs-sys would otherwise try to download wasi-sdk.
    cmd.env("RQUICKJS_SYS_NO_WASI_SDK", "1");
    for (k, v) in &c_env {
        cmd.env(k, v);
    }
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("failed to run cargo to build the wasm32-wasip2 guests");
    if !status.success() {
        panic!(
            "building the example and test actors for wasm32-wasip2 failed (see above). \
             If the target is missing, run `rustup target add wasm32-wasip2`."
        );
    }
    let out = target_dir.join("wasm32-wasip2").join("guest");
    for (name, _) in GUESTS {
        let file = out.join(format!("{}.wasm", name.replace('-', "_")));
        assert!(
            file.exists(),
            "guest `{name}` was not built at {}",
            file.display()
        );
        let var = format!("MARMOT_GUEST_{}", name.replace('-', "_").to_uppercase());
        println!("cargo:rustc-env={var}={}", file.display());
    }
}

/// The C toolchain for QuickJS: the caller's settings if given, else clang,
/// llvm-ar and Debian's wasi-libc headers, checked up front so a missing
/// package is one clear message rather than a C compiler error.
fn c_toolchain() -> Vec<(String, String)> {
    for var in [
        "CC_wasm32_wasip2",
        "AR_wasm32_wasip2",
        "CFLAGS_wasm32_wasip2",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if std::env::var_os("CC_wasm32_wasip2").is_some() {
        // The caller chose a toolchain; pass it through, with our defines.
        let flags = std::env::var("CFLAGS_wasm32_wasip2").unwrap_or_default();
        return vec![(
            "CFLAGS_wasm32_wasip2".into(),
            format!("{flags} {QUICKJS_DEFINES}"),
        )];
    }
    let missing: Vec<&str> = [("clang", "clang"), ("llvm-ar", "llvm")]
        .into_iter()
        .filter(|(bin, _)| Command::new(bin).arg("--version").output().is_err())
        .map(|(_, pkg)| pkg)
        .chain((!Path::new(DEBIAN_WASI_INCLUDE).join("stdio.h").exists()).then_some("wasi-libc"))
        .collect();
    if !missing.is_empty() {
        panic!(
            "building the JavaScript engine (QuickJS for wasm32-wasip2) needs a C toolchain: \
             install the Debian/Ubuntu packages `{}` (`sudo apt-get install clang llvm wasi-libc`; \
             ./scripts/dev and ./scripts/test do this), or set CC_wasm32_wasip2, \
             AR_wasm32_wasip2 and CFLAGS_wasm32_wasip2 for another toolchain",
            missing.join(" ")
        );
    }
    vec![
        ("CC_wasm32_wasip2".into(), "clang".into()),
        ("AR_wasm32_wasip2".into(), "llvm-ar".into()),
        (
            "CFLAGS_wasm32_wasip2".into(),
            format!("-isystem {DEBIAN_WASI_INCLUDE} {QUICKJS_DEFINES}"),
        ),
    ]
}

/// Fail with a clear message instead of a wall of `can't find crate for core`.
fn check_target_installed() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(&rustc).args(["--print", "sysroot"]).output() else {
        return;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let lib = Path::new(&sysroot).join("lib/rustlib/wasm32-wasip2");
    if !sysroot.is_empty() && !lib.exists() {
        panic!(
            "the wasm32-wasip2 target is not installed for this toolchain ({sysroot}); \
             run `rustup target add wasm32-wasip2`"
        );
    }
}

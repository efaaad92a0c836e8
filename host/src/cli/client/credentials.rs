//! Secrets (set without echo, list, remove) and client tokens.

use std::path::Path;

use anyhow::Context as _;
use reqwest::{Method, StatusCode};

use super::{Client, seg};
use crate::cli::ClientArgs;

/// `marmot secrets set NAME --host H… [--from-file F]`: the value comes
/// from the file or from stdin; one trailing newline is dropped (what
/// `echo` and editors add).
pub(in crate::cli) async fn secret_set(
    args: &ClientArgs,
    name: &str,
    hosts: &[String],
    from_file: Option<&Path>,
) -> anyhow::Result<()> {
    use std::io::Read as _;
    // A bad `--url` is said before the value is typed.
    let c = Client::new(args)?;
    let mut raw = zeroize::Zeroizing::new(Vec::new());
    match from_file {
        Some(path) => {
            *raw = std::fs::read(path)
                .with_context(|| format!("cannot read the value from `{}`", path.display()))?;
        }
        None if std::io::IsTerminal::is_terminal(&std::io::stdin()) => {
            // Typed: asked for, and not echoed (it used to show on the
            // screen, into scrollback and recordings).
            let line = {
                // Quiet before the prompt: what is typed after it is never
                // echoed.
                let _quiet = NoEcho::on_stdin();
                eprint!("value of secret {name} (not shown; Enter ends it): ");
                let mut line = zeroize::Zeroizing::new(String::new());
                std::io::stdin()
                    .read_line(&mut line)
                    .context("cannot read the value from the terminal")?;
                line
            };
            eprintln!();
            raw.extend_from_slice(line.as_bytes());
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut raw)
                .context("cannot read the value from stdin")?;
        }
    }
    let mut value: &[u8] = &raw;
    if let Some(v) = value.strip_suffix(b"\n") {
        value = v.strip_suffix(b"\r").unwrap_or(v);
    }
    let value = std::str::from_utf8(value).context("the secret value must be UTF-8 text")?;
    let body = zeroize::Zeroizing::new(
        serde_json::to_vec(&serde_json::json!({ "value": value, "hosts": hosts }))
            .expect("JSON values serialize"),
    );
    let req = c
        .request(Method::PUT, &format!("/v1/secrets/{}", seg(name)))
        .header("content-type", "application/json")
        .body(body.to_vec());
    let (status, body) = c.send(req).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let verb = if status == StatusCode::CREATED {
        "created"
    } else {
        "replaced"
    };
    println!("secret {name} {verb}; may be sent to {}", v["hosts"]);
    Ok(())
}

/// The terminal on stdin with its echo off, until dropped.
struct NoEcho(Option<libc::termios>);

/// The terminal settings [`NoEcho`] took echo from, for a signal that ends
/// the process before its `Drop` runs (Ctrl-C at the prompt left the
/// user's shell without echo).
static SAVED_TERMIOS: std::sync::OnceLock<libc::termios> = std::sync::OnceLock::new();
/// The signals that end a prompt.
const PROMPT_SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Put the terminal back and die of `sig` as if unhandled.
extern "C" fn restore_and_die(sig: libc::c_int) {
    // SAFETY: tcsetattr, signal and raise are async-signal-safe; the saved
    // termios was set before this handler was installed and never changes.
    #[allow(unsafe_code, reason = "a signal handler restoring the terminal")]
    unsafe {
        if let Some(saved) = SAVED_TERMIOS.get() {
            libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved);
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

impl NoEcho {
    fn on_stdin() -> Self {
        let mut saved = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: tcgetattr fills `saved` when it returns 0, and only then
        // is it read; tcsetattr reads a valid termios; the handler only
        // reads what was saved before it was installed.
        #[allow(unsafe_code, reason = "turning the terminal's echo off")]
        unsafe {
            if libc::tcgetattr(libc::STDIN_FILENO, saved.as_mut_ptr()) != 0 {
                return Self(None);
            }
            let saved = saved.assume_init();
            let _ = SAVED_TERMIOS.set(saved);
            let handler = restore_and_die as extern "C" fn(libc::c_int);
            for sig in PROMPT_SIGNALS {
                libc::signal(sig, handler as libc::sighandler_t);
            }
            let mut quiet = saved;
            quiet.c_lflag &= !libc::ECHO;
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &quiet) != 0 {
                return Self(None);
            }
            Self(Some(saved))
        }
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        // SAFETY: restores the termios tcgetattr returned, and the default
        // action of the signals `on_stdin` caught.
        #[allow(unsafe_code, reason = "turning the terminal's echo back on")]
        unsafe {
            if let Some(saved) = &self.0 {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved);
            }
            for sig in PROMPT_SIGNALS {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

/// `marmot secrets list`.
pub(in crate::cli) async fn secret_list(args: &ClientArgs) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c.send(c.request(Method::GET, "/v1/secrets")).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let secrets = v["secrets"].as_array().cloned().unwrap_or_default();
    if secrets.is_empty() {
        println!("no secrets");
    }
    for s in secrets {
        let hosts: Vec<&str> = s["hosts"]
            .as_array()
            .map(|h| h.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        println!(
            "{}\thosts={}\tupdated_at_ms={}",
            s["name"].as_str().unwrap_or(""),
            hosts.join(","),
            s["updated_at_ms"]
        );
    }
    Ok(())
}
/// `marmot tokens mint …`: print the minted token as JSON.
pub(in crate::cli) async fn token_mint(
    args: &ClientArgs,
    spec: serde_json::Value,
) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c
        .send(c.request(Method::POST, "/v1/tokens").json(&spec))
        .await?;
    println!("{}", String::from_utf8_lossy(&body));
    Ok(())
}
/// `marmot tokens revoke TOKEN_ID`.
pub(in crate::cli) async fn token_revoke(args: &ClientArgs, token_id: &str) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    c.send(c.request(Method::DELETE, &format!("/v1/tokens/{}", seg(token_id))))
        .await?;
    println!("token {token_id} revoked");
    Ok(())
}
/// `marmot secrets rm NAME`.
pub(in crate::cli) async fn secret_rm(args: &ClientArgs, name: &str) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    c.send(c.request(Method::DELETE, &format!("/v1/secrets/{}", seg(name))))
        .await?;
    println!("secret {name} deleted");
    Ok(())
}

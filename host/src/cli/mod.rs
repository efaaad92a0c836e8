//! The `marmot` command line (PRODUCT.md §6).
//!
//! Server commands (`dev`, `serve`) run a [`Node`](crate::node::Node) and the
//! HTTP API; client commands talk to a node over HTTP. Errors are printed as
//! one line and the process exits non-zero.

mod assistant;
mod client;
mod hugepages;
mod log_fields;
mod open_files;
mod server;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Marmot: hibernating WebAssembly actors for AI agents.
#[derive(Parser)]
#[command(name = "marmot", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter (tracing env-filter syntax, e.g. `info,marmot::api=debug`);
    /// `RUST_LOG` is read when neither this nor MARMOT_LOG is set.
    #[arg(long, global = true, env = "MARMOT_LOG")]
    log: Option<String>,
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "MARMOT_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a development node on 127.0.0.1 with auth off and the examples deployed.
    Dev(server::DevArgs),
    /// Run a production node (bearer auth required).
    Serve(server::ServeArgs),
    /// Deploy FILE (.wasm component, .js/.mjs module, or .json manifest) as a new version of TYPE.
    Deploy {
        /// Actor type.
        #[arg(value_name = "TYPE", value_parser = non_empty)]
        ty: String,
        /// The component or manifest.
        file: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Send a message to actor (TYPE, ID) and print the reply.
    Call {
        /// Actor type.
        #[arg(value_name = "TYPE", value_parser = non_empty)]
        ty: String,
        /// Actor id.
        #[arg(value_parser = actor_id)]
        id: String,
        /// The message (JSON); `-` reads it from standard input and `@FILE`
        /// from a file (a command line holds ~128 KiB); empty when absent.
        json: Option<String>,
        /// Enqueue durably and return the message id instead of waiting.
        #[arg(long)]
        no_wait: bool,
        /// Idempotency key: a repeat returns the first reply.
        #[arg(long)]
        idempotency_key: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List actors of TYPE.
    Actors {
        /// Actor type.
        #[arg(value_name = "TYPE", value_parser = non_empty)]
        ty: String,
        /// Only ids starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Most actors to list.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show an actor's status, state and recent events.
    Inspect {
        /// Actor type.
        #[arg(value_name = "TYPE", value_parser = non_empty)]
        ty: String,
        /// Actor id.
        #[arg(value_parser = actor_id)]
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print an actor's events, one JSON object per line.
    Events {
        /// Actor type.
        #[arg(value_name = "TYPE", value_parser = non_empty)]
        ty: String,
        /// Actor id.
        #[arg(value_parser = actor_id)]
        id: String,
        /// Start after this event seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Keep streaming new events (reconnects and resumes by itself).
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show an actor's pending alarms.
    Alarms {
        /// Actor type.
        #[arg(value_name = "TYPE", value_parser = non_empty)]
        ty: String,
        /// Actor id.
        #[arg(value_parser = actor_id)]
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List deployed types.
    Types {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Manage the node's secrets (values are write-only).
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// Mint and revoke client tokens (a browser or app talks to its own actor).
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// The cluster as the node sees it.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Back up a running node: a consistent copy of its database and blobs,
    /// written by the node into a new directory on its machine.
    Backup {
        /// The backup directory (must not exist; relative paths are taken
        /// from here, which is right when the node runs on this machine).
        #[arg(long)]
        to: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Restore a backup into an empty data directory (no node running on
    /// it). A backup from a newer Marmot is refused.
    Restore {
        /// The backup directory.
        from: PathBuf,
        /// The data directory to create.
        #[arg(long, env = "MARMOT_DATA_DIR")]
        data: PathBuf,
    },
    /// Run a benchmark scenario and print percentiles.
    Bench(crate::bench::BenchArgs),
}

#[derive(Subcommand)]
enum SecretsCommand {
    /// Set (or replace) secret NAME; the value comes from stdin or --from-file.
    Set {
        /// The secret's name, as guests write it in `{{secret:NAME}}`.
        name: String,
        /// A host it may be sent to (`api.example.com`, `*.example.com`);
        /// repeat for several. Only https requests to these get it.
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// Read the value from this file instead of stdin.
        #[arg(long)]
        from_file: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List secrets: names, hosts and times (never values).
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete secret NAME.
    Rm {
        /// The secret's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a new random master key (base64) for MARMOT_MASTER_KEY or a key
    /// file; no node is contacted.
    NewKey,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Members (node id, region, advertise URL, alive), slots per node and
    /// the slots nobody can serve now.
    Status {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Move actor (TYPE, ID) with all its data to a node of REGION.
    Move {
        /// Actor type.
        #[arg(value_name = "TYPE", value_parser = non_empty)]
        ty: String,
        /// Actor id.
        #[arg(value_parser = actor_id)]
        id: String,
        /// The region to move it to.
        #[arg(long)]
        region: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Move used slots to the preferred node of their region (after adding
    /// a node, or when one came back), a few at a time; `status` shows the
    /// progress.
    Rebalance {
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand)]
enum TokensCommand {
    /// Mint a token for actor ID of TYPE (or every id starting with
    /// --prefix) and print it as JSON: {token, expires_at_ms, token_id}.
    Mint {
        /// Actor type.
        #[arg(value_name = "TYPE", value_parser = non_empty)]
        ty: String,
        /// Actor id (omit with --prefix).
        #[arg(required_unless_present = "prefix", conflicts_with = "prefix")]
        id: Option<String>,
        /// Every actor id starting with this instead of one id.
        #[arg(long)]
        prefix: Option<String>,
        /// Verbs allowed: send, events, inputs, files (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "send,events")]
        scopes: Vec<String>,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Revoke a token by the `token_id` printed when it was minted.
    Revoke {
        /// The token's id.
        token_id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Where the node is.
#[derive(Args, Clone)]
pub struct ClientArgs {
    /// Node URL.
    #[arg(long, env = "MARMOT_URL", default_value = "http://127.0.0.1:7878")]
    pub url: String,
    /// Bearer token (defaults to MARMOT_ADMIN_TOKEN).
    #[arg(long, env = "MARMOT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl ClientArgs {
    fn token(&self) -> Option<String> {
        self.token
            .clone()
            .or_else(|| std::env::var("MARMOT_ADMIN_TOKEN").ok())
            .filter(|t| !t.is_empty())
    }
}

/// Entry point of the `marmot` binary.
pub fn main() -> ExitCode {
    // Before the runtime starts its threads.
    let huge_pages = hugepages::turn_off_unless_asked();
    let open_files = open_files::raise();
    let cli = Cli::parse();
    let only_prints = cli.command.only_prints();
    if only_prints {
        die_quietly_when_the_reader_leaves();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if only_prints {
        builder.on_thread_start(sockets_say_broken_pipe);
    }
    let runtime = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "info".to_owned());
    let exporter = init_logging(&filter, cli.log_format, runtime.handle());
    let result = runtime.block_on(run(cli.command, huge_pages, open_files));
    if let Some(exporter) = exporter {
        // Flushes on this thread; its requests run on the runtime.
        exporter.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

impl Command {
    /// A client command: it asks a node and prints the answer, and holds
    /// nothing that stopping half-way would leave behind.
    fn only_prints(&self) -> bool {
        match self {
            Command::Deploy { .. }
            | Command::Call { .. }
            | Command::Actors { .. }
            | Command::Inspect { .. }
            | Command::Events { .. }
            | Command::Alarms { .. }
            | Command::Types { .. }
            | Command::Secrets(_)
            | Command::Tokens(_)
            | Command::Cluster(_) => true,
            Command::Dev(_)
            | Command::Serve(_)
            | Command::Backup { .. }
            | Command::Restore { .. }
            | Command::Bench(_) => false,
        }
    }
}

/// `marmot actors | head -1`: end as `cat` would when the reader closes
/// the pipe (killed by `SIGPIPE`, no message), rather than panic in
/// `println!`. Rust ignores the signal for every program, which suits the
/// servers: a write to a socket whose client left is then an error of
/// that one connection.
fn die_quietly_when_the_reader_leaves() {
    // SAFETY: called before any thread starts; restoring a signal's default
    // disposition installs no handler.
    #[allow(unsafe_code, reason = "one signal() back to the default")]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// On the runtime's threads, where the client's sockets are written (its
/// connections run as tasks there; the main thread only prints), a write
/// to a socket the node has closed is an error, as in any Rust program,
/// not `SIGPIPE`: a body the node refuses without reading it (past
/// 128 MiB) used to end the CLI with no word at all. `SIGPIPE` from a
/// write is sent to the writing thread, so blocking it here leaves
/// `marmot actors | head -1` to die quietly on the main thread.
fn sockets_say_broken_pipe() {
    // SAFETY: changes only the calling thread's signal mask.
    #[allow(unsafe_code, reason = "one pthread_sigmask() on the calling thread")]
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// One line for the log: how many threads run HTTP and turns, and who
/// chose. One per core (tokio's default) serves the most turns under load;
/// one in all answers a lone request sooner on a small host, where the
/// second worker's wake-ups cost more than it gives (README,
/// "Configuration"; docs/design.md, "One worker thread per core").
fn log_workers() {
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(set) => tracing::info!(workers, "worker threads as TOKIO_WORKER_THREADS={set} says"),
        Err(_) => tracing::info!(
            workers,
            "one worker thread per core (set TOKIO_WORKER_THREADS to choose)"
        ),
    }
}

/// A TYPE or ID argument: an empty one would address no endpoint ("no
/// such endpoint" said nothing useful).
fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_owned())
}

/// An actor id the CLI can put in a URL: any but `.` and `..`, which every
/// URL parser (this one, browsers, `fetch`) takes for "here" and "the
/// parent directory", encoded or not, so that a request for them reaches
/// another resource (`alarms kit ..` asked for the type `alarms`).
fn actor_id(s: &str) -> Result<String, String> {
    if s == "." || s == ".." {
        return Err(format!(
            "the id `{s}` cannot be sent in a URL (it is read as a directory step); \
             only a client that sends the path as is (`curl --path-as-is`, `%2E`) reaches it"
        ));
    }
    non_empty(s)
}

/// An error and its causes on one line. A cause whose text the line holds
/// already is left out: many errors name their source in their own text
/// (`failed to create `x`: No such file or directory`), and `{e:#}` said
/// it twice.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        // Only the trailing "what: source" repeat: a short cause ("EOF")
        // found elsewhere in the line is still news.
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    // One line, as typed: a message may carry an actor's words, and an
    // escape sequence in it must not reach the terminal.
    line.chars()
        .map(|c| match c {
            '\n' => " ".to_owned(),
            // Control characters, and the invisible ones that reorder or
            // hide text (bidi overrides, zero-width marks).
            c if c.is_control()
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') =>
            {
                format!("\\u{{{:x}}}", c as u32)
            }
            c => c.to_string(),
        })
        .collect()
}

async fn run(
    command: Command,
    huge_pages: hugepages::HugePages,
    open_files: open_files::OpenFiles,
) -> anyhow::Result<()> {
    match command {
        Command::Dev(args) => {
            huge_pages.log();
            open_files.log();
            log_workers();
            server::dev(args).await
        }
        Command::Serve(args) => {
            huge_pages.log();
            open_files.log();
            log_workers();
            server::serve(args).await
        }
        Command::Deploy { ty, file, client } => client::deploy(&client, &ty, &file).await,
        Command::Call {
            ty,
            id,
            json,
            no_wait,
            idempotency_key,
            client,
        } => client::call(&client, &ty, &id, json, no_wait, idempotency_key).await,
        Command::Actors {
            ty,
            prefix,
            limit,
            client,
        } => {
            client::actors(
                &client,
                &ty,
                &prefix,
                usize::try_from(limit).unwrap_or(usize::MAX),
            )
            .await
        }
        Command::Inspect { ty, id, client } => client::inspect(&client, &ty, &id).await,
        Command::Events {
            ty,
            id,
            after,
            follow,
            client,
        } => client::events(&client, &ty, &id, after, follow).await,
        Command::Alarms { ty, id, client } => client::alarms(&client, &ty, &id).await,
        Command::Types { client } => client::types(&client).await,
        Command::Secrets(cmd) => match cmd {
            SecretsCommand::Set {
                name,
                hosts,
                from_file,
                client,
            } => client::secret_set(&client, &name, &hosts, from_file.as_deref()).await,
            SecretsCommand::List { client } => client::secret_list(&client).await,
            SecretsCommand::Rm { name, client } => client::secret_rm(&client, &name).await,
            SecretsCommand::NewKey => {
                println!(
                    "{}",
                    crate::secrets::MasterKey::generate().to_base64().as_str()
                );
                Ok(())
            }
        },
        Command::Tokens(TokensCommand::Mint {
            ty,
            id,
            prefix,
            scopes,
            ttl,
            client,
        }) => {
            let spec = serde_json::json!({
                "type": ty, "id": id, "id_prefix": prefix, "scopes": scopes, "ttl_s": ttl,
            });
            client::token_mint(&client, spec).await
        }
        Command::Backup { to, client } => {
            let to = std::path::absolute(&to)?;
            client::backup(&client, &to).await
        }
        Command::Restore { from, data } => {
            let report =
                crate::storage::backup::restore(&from, &data, &[crate::secrets::DEV_KEY_FILE])?;
            let key = if report
                .files
                .iter()
                .any(|f| f == crate::secrets::DEV_KEY_FILE)
            {
                "with the dev node's key file"
            } else {
                "its secrets open only with the master key the node had (`MARMOT_MASTER_KEY` or `master_key_file`)"
            };
            println!(
                "restored `{}` into `{}` ({} blobs checked; {key}); start the node on it",
                from.display(),
                data.display(),
                report.blobs,
            );
            Ok(())
        }
        Command::Tokens(TokensCommand::Revoke { token_id, client }) => {
            client::token_revoke(&client, &token_id).await
        }
        Command::Cluster(ClusterCommand::Status { client }) => {
            client::cluster_status(&client).await
        }
        Command::Cluster(ClusterCommand::Move {
            ty,
            id,
            region,
            client,
        }) => client::move_actor(&client, &ty, &id, &region).await,
        Command::Cluster(ClusterCommand::Rebalance { client }) => client::rebalance(&client).await,
        Command::Bench(args) => crate::bench::run(args).await,
    }
}

/// `filter` with the compiler's own debug and trace output off unless it
/// names the compiler: at `trace`, Cranelift logs every instruction it
/// lowers, gigabytes for one compile of the JavaScript engine.
fn quiet_compiler(filter: &str) -> String {
    let mut out = filter.trim().to_owned();
    for target in ["cranelift", "regalloc2"] {
        if !filter.contains(target) {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(target);
            out.push_str("=info");
        }
    }
    out
}

/// Set once logging starts: whether the log is JSON, one object per line
/// (where `marmot dev` must not print its greeting as plain text).
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the log is JSON.
fn logs_are_json() -> bool {
    JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Logs to stderr, and OpenTelemetry traces when the environment asks for
/// them (`OTEL_EXPORTER_OTLP_ENDPOINT`; see `telemetry`).
fn init_logging(
    filter: &str,
    format: LogFormat,
    runtime: &tokio::runtime::Handle,
) -> Option<crate::telemetry::Exporter> {
    JSON_LOGS.store(
        matches!(format, LogFormat::Json),
        std::sync::atomic::Ordering::Relaxed,
    );
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{EnvFilter, Layer as _};
    let filter = EnvFilter::try_new(quiet_compiler(filter)).unwrap_or_else(|e| {
        eprintln!("warning: invalid log filter `{filter}` ({e}); using `info`");
        EnvFilter::new("info")
    });
    // Colours only for a person at a terminal (not a file, a pipe or a
    // journal), and never with NO_COLOR set (no-color.org).
    use std::io::IsTerminal as _;
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = match format {
        LogFormat::Text => fmt.fmt_fields(log_fields::EscapedFields).boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    let (otel, exporter) = if crate::telemetry::requested() {
        match crate::telemetry::layer(runtime.clone()) {
            Ok((layer, exporter)) => (Some(layer), Some(exporter)),
            Err(e) => {
                eprintln!("warning: OpenTelemetry traces are off: {e:#}");
                (None, None)
            }
        }
    } else {
        (None, None)
    };
    match otel {
        // Each layer has its own filter: `--log warn` turned off every
        // trace too (found by a probe). Traces take info and above.
        Some(otel) => tracing_subscriber::registry()
            .with(fmt.with_filter(filter))
            .with(otel.with_filter(tracing_subscriber::filter::LevelFilter::INFO))
            .init(),
        // Without traces, one filter for all: a per-layer one beside an
        // absent layer made every filtered-out `debug!` callsite "sometimes"
        // (checked at each hit) under a filter with any debug directive.
        None => tracing_subscriber::registry().with(fmt).with(filter).init(),
    }
    exporter
}

/// Parse `--listen`.
pub(crate) fn parse_listen(s: &str) -> anyhow::Result<SocketAddr> {
    s.parse().map_err(|e| {
        anyhow::anyhow!("invalid listen address `{s}`: {e} (expected e.g. 127.0.0.1:7878)")
    })
}

#[cfg(test)]
mod tests {
    use super::quiet_compiler;

    #[test]
    fn the_compiler_stays_quiet_unless_named() {
        assert_eq!(
            quiet_compiler("trace"),
            "trace,cranelift=info,regalloc2=info"
        );
        assert_eq!(quiet_compiler(""), "cranelift=info,regalloc2=info");
        assert_eq!(
            quiet_compiler("info,cranelift_codegen=trace"),
            "info,cranelift_codegen=trace,regalloc2=info"
        );
    }
}

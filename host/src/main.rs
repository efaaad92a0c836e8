//! The `marmot` command line.

fn main() -> std::process::ExitCode {
    marmot::cli::main()
}

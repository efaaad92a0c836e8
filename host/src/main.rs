//! The `marmot` command line.

/// glibc's malloc spends a fifth of a busy node's CPU in arena locks and
/// consolidation (measured with `perf` under `marmot bench http-spread`);
/// mimalloc's per-thread heaps avoid both.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    marmot::cli::main()
}

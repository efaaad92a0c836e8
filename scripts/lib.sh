# Shared set-up for the scripts: make sure the pinned toolchain (see
# rust-toolchain.toml) and the wasm32-wasip2 target are installed, even where
# rustup's automatic installs are turned off.

ensure_toolchain() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: Rust is not installed; install rustup from https://rustup.rs and run this again" >&2
        exit 1
    fi
    if command -v rustup >/dev/null 2>&1; then
        # Installs the toolchain named in rust-toolchain.toml if it is missing.
        rustup toolchain install --no-self-update >/dev/null 2>&1 || rustup toolchain install
        rustup target add wasm32-wasip2 >/dev/null
    else
        echo "warning: rustup not found; assuming the wasm32-wasip2 target is installed" >&2
    fi
}

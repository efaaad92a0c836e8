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

# The JavaScript engine embeds QuickJS (C): it needs clang, llvm-ar and a
# wasm32-wasi libc. Install Debian/Ubuntu's packages when they are missing.
ensure_c_toolchain() {
    if command -v clang >/dev/null 2>&1 && command -v llvm-ar >/dev/null 2>&1 \
        && [ -f /usr/include/wasm32-wasi/stdio.h ]; then
        return 0
    fi
    if [ -n "${CC_wasm32_wasip2:-}" ]; then
        return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: the JavaScript engine needs clang, llvm-ar and wasi-libc headers; install them" \
             "(or set CC_wasm32_wasip2, AR_wasm32_wasip2, CFLAGS_wasm32_wasip2)" >&2
        exit 1
    fi
    apt_install "for the JavaScript engine" clang llvm wasi-libc
}

# The etcd client (cluster membership) is generated from etcd's protobuf
# files at build time: it needs protoc (Debian's protobuf-compiler).
ensure_protoc() {
    if [ -n "${PROTOC:-}" ] || command -v protoc >/dev/null 2>&1; then
        return 0
    fi
    ensure_commands protoc:protobuf-compiler
}

# The cluster tests run real etcd (Debian's etcd-server, 3.4+).
ensure_etcd() {
    ensure_commands etcd:etcd-server
}

# What the tests that need more than this repository may require of this
# machine, comma-separated: `etcd` (installed above), `tmpfs` (mounting a
# size-limited tmpfs: root), `netns` (network namespaces on a bridge: root,
# CAP_NET_ADMIN and iproute2, installed here when root). Each is probed, not
# assumed. `scripts/test` exports the list as MARMOT_TEST_REQUIRE, so that a
# test needing one of them fails rather than skips (tests/common `skip`).
test_capabilities() {
    caps=""
    command -v etcd >/dev/null 2>&1 && caps="etcd"
    [ "$(id -u)" = 0 ] || { echo "$caps"; return 0; }
    probe=$(mktemp -d)
    if mount -t tmpfs -o size=1m marmot-probe "$probe" 2>/dev/null; then
        umount "$probe" && caps="$caps,tmpfs"
    fi
    rmdir "$probe" || true
    (ensure_commands ip:iproute2) >&2 || true
    bridge="mprobe$$"
    if command -v ip >/dev/null 2>&1 && ip link add "$bridge" type bridge 2>/dev/null; then
        ip link del "$bridge" || true
        if ip netns add "$bridge" 2>/dev/null; then
            ip netns del "$bridge" && caps="$caps,netns"
        fi
    fi
    echo "${caps#,}"
}

# Install Debian packages for the commands named, when a command is missing:
# ensure_commands "wrk:wrk" "npm:npm".
ensure_commands() {
    missing=""
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing="$missing ${pair#*:}"
    done
    [ -z "$missing" ] && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: please install:$missing" >&2
        exit 1
    fi
    apt_install "" $missing
}

# apt-get install the packages after the first argument (what they are
# for, shown to the user), as root or through sudo.
apt_install() {
    why=$1
    shift
    if [ "$(id -u)" = 0 ]; then
        SUDO=""
    elif command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "error: installing $* needs root: run 'apt-get install -y $*' as root, then run this again" >&2
        exit 1
    fi
    echo "installing $*${why:+ ($why)}…" >&2
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

//! The memory limit of the cgroup this process runs in.
//!
//! A node started by systemd with `MemoryMax=`, or in a container, has a
//! memory limit well below the machine's, and past it the kernel kills the
//! node. The limit is on the process's own cgroup or one of its
//! ancestors, which `/proc/self/cgroup` names and `/proc/self/mountinfo`
//! places in the file system:
//!
//! * cgroup v2 (one hierarchy, `0::/path`): the smallest `memory.max` from
//!   the process's cgroup up to the hierarchy's root;
//! * cgroup v1 (a `memory` controller line, `N:memory:/path`):
//!   `hierarchical_memory_limit` in the cgroup's `memory.stat`, which
//!   already takes the ancestors in, else its `memory.limit_in_bytes`.
//!
//! Inside a cgroup namespace the process's path is `/` and the mount's root
//! is the namespace's cgroup, so both read the container's own files.

use std::path::{Path, PathBuf};

/// v1 reports "no limit" as a huge number (page-rounded `i64::MAX`).
const V1_UNLIMITED: u64 = 1 << 62;

/// The cgroup memory limit of this process, if it has one.
pub(super) fn memory_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    limit_from(&cgroups, &mounts, |p| std::fs::read_to_string(p).ok())
}

/// [`memory_limit`] from the text of `/proc/self/cgroup` and
/// `/proc/self/mountinfo`, reading cgroup files with `read`.
fn limit_from(
    cgroups: &str,
    mountinfo: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let v2 = || {
        let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
        let (root, mount) = mount_of(mountinfo, |fs, _| fs == "cgroup2")?;
        let mut dir = within(&mount, &root, path)?;
        let mut limit: Option<u64> = None;
        loop {
            if let Some(v) = read(&dir.join("memory.max")).and_then(|s| s.trim().parse().ok()) {
                limit = Some(limit.map_or(v, |l: u64| l.min(v)));
            }
            if dir == mount || !dir.pop() {
                return limit;
            }
        }
    };
    let v1 = || {
        let path = cgroups.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then_some(path)
        })?;
        let (root, mount) = mount_of(mountinfo, |fs, opts| {
            fs == "cgroup" && opts.split(',').any(|o| o == "memory")
        })?;
        let dir = within(&mount, &root, path)?;
        let hierarchical = read(&dir.join("memory.stat")).and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        let own =
            || read(&dir.join("memory.limit_in_bytes")).and_then(|s| s.trim().parse::<u64>().ok());
        hierarchical.or_else(own).filter(|&v| v < V1_UNLIMITED)
    };
    v2().or_else(v1)
}

/// The root and mount point of the first mount whose file system type and
/// super options `matches`.
fn mount_of(mountinfo: &str, matches: impl Fn(&str, &str) -> bool) -> Option<(String, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        // `id parent dev root mountpoint opts [optional…] - fstype source superopts`
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let (fs, _source, opts) = (right.next()?, right.next()?, right.next().unwrap_or(""));
        (left.len() >= 5 && matches(fs, opts))
            .then(|| (unescape(left[3]), PathBuf::from(unescape(left[4]))))
    })
}

/// The directory of cgroup `path` under a mount of the hierarchy's `root`
/// at `mount`: none if the cgroup is outside what is mounted.
fn within(mount: &Path, root: &str, path: &str) -> Option<PathBuf> {
    let rel = if root == "/" {
        path
    } else {
        path.strip_prefix(root)
            .filter(|r| r.is_empty() || r.starts_with('/'))?
    };
    let rel = rel.trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    })
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const V2_MOUNT: &str = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
    const V1_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries
            .iter()
            .map(|(p, v)| (PathBuf::from(p), v.to_string()))
            .collect();
        move |p| map.get(p).cloned()
    }

    #[test]
    fn a_systemd_service_limit_is_found_on_its_own_cgroup() {
        let read = files(&[
            (
                "/sys/fs/cgroup/system.slice/marmot.service/memory.max",
                "1073741824\n",
            ),
            ("/sys/fs/cgroup/system.slice/memory.max", "max\n"),
        ]);
        let got = limit_from("0::/system.slice/marmot.service\n", V2_MOUNT, read);
        assert_eq!(got, Some(1 << 30));
    }

    #[test]
    fn the_smallest_limit_on_the_way_up_applies() {
        let read = files(&[
            ("/sys/fs/cgroup/a/b/memory.max", "max\n"),
            ("/sys/fs/cgroup/a/memory.max", "536870912\n"),
        ]);
        assert_eq!(limit_from("0::/a/b\n", V2_MOUNT, read), Some(512 << 20));
        // No limit anywhere.
        let read = files(&[("/sys/fs/cgroup/a/memory.max", "max\n")]);
        assert_eq!(limit_from("0::/a\n", V2_MOUNT, read), None);
    }

    #[test]
    fn a_container_reads_its_namespace_root() {
        let read = files(&[("/sys/fs/cgroup/memory.max", "268435456\n")]);
        assert_eq!(limit_from("0::/\n", V2_MOUNT, read), Some(256 << 20));
    }

    #[test]
    fn cgroup_v1_takes_the_hierarchical_limit() {
        let cgroups = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/process_api/abc/memory.stat",
                "cache 0\nhierarchical_memory_limit 1073741824\n",
            ),
            (
                "/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        assert_eq!(limit_from(cgroups, V1_MOUNTS, read), Some(1 << 30));
        // v1's "unlimited" is no limit.
        let read = files(&[(
            "/sys/fs/cgroup/memory/process_api/abc/memory.stat",
            "hierarchical_memory_limit 9223372036854771712\n",
        )]);
        assert_eq!(limit_from(cgroups, V1_MOUNTS, read), None);
    }

    #[test]
    fn paths_outside_the_mount_and_odd_input_give_no_limit() {
        let mount = "30 23 0:26 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let read = files(&[("/sys/fs/cgroup/memory.max", "1\n")]);
        assert_eq!(limit_from("0::/elsewhere\n", mount, &read), None);
        assert_eq!(limit_from("0::/kubepods\n", mount, &read), Some(1));
        assert_eq!(limit_from("0::/../x\n", V2_MOUNT, &read), None);
        assert_eq!(limit_from("", "", &read), None);
        assert_eq!(limit_from("garbage", "garbage", &read), None);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain\"), r"/plain\");
    }
}

//! A size-limited file system for disk-fault tests (needs root).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `mb` megabytes mounted at `dir`, unmounted on drop.
pub struct SmallDisk {
    pub dir: PathBuf,
}

impl SmallDisk {
    pub fn mount(dir: &Path, mb: u32) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "marmot-test"])
            .arg(dir)
            .output()
            .ok()?;
        if !out.status.success() {
            super::skip(
                "tmpfs",
                &format!(
                    "mounting a size-limited tmpfs needs root: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            );
            return None;
        }
        Some(Self {
            dir: dir.to_owned(),
        })
    }

    /// Write a file until the file system is full; returns its path.
    pub fn fill(&self) -> PathBuf {
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        // Partial chunks: fill the last bytes too.
        while f.write(&[0xa5u8; 512]).is_ok_and(|n| n > 0) {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

const fn libc_enospc() -> i32 {
    28
}

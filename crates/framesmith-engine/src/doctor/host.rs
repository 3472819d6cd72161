//! The host side of the system check: RAM (sysinfo), the page-locked memory limit (Linux `/proc/self/limits`,
//! Windows' half of RAM), the free space on the disk that holds the output folder (sysinfo's disks, matched
//! through `/proc/self/mounts` on Linux) and which shared libraries the process has loaded (`/proc/self/maps`).
//! The parsers are plain functions on the files' text, tested without the machine.

use std::path::{Path, PathBuf};

use framesmith_config::protocol::doctor::{DiskFacts, MemoryFacts, PageLockedLimit};

/// RAM and the page-locked limit.
pub fn memory() -> MemoryFacts {
    let (total, available) = ram();
    MemoryFacts {
        ram_total_bytes: total,
        ram_available_bytes: available,
        page_locked: page_locked_limit(total),
    }
}

#[cfg(feature = "telemetry")]
fn ram() -> (Option<u64>, Option<u64>) {
    use sysinfo::{MemoryRefreshKind, System};
    let Ok(mut system) = System::new() else {
        return (None, None);
    };
    system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
    let known = |b: u64| Some(b).filter(|&b| b > 0);
    (
        known(system.total_memory()),
        known(system.available_memory()),
    )
}

#[cfg(not(feature = "telemetry"))]
fn ram() -> (Option<u64>, Option<u64>) {
    (None, None)
}

fn page_locked_limit(ram_total: Option<u64>) -> PageLockedLimit {
    if cfg!(windows) {
        return ram_total.map_or(PageLockedLimit::Unknown, |b| {
            PageLockedLimit::HalfOfRam(b / 2)
        });
    }
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| memlock_limit(&text))
        .unwrap_or(PageLockedLimit::Unknown)
}

/// The soft "Max locked memory" limit of `/proc/self/limits` (what `ulimit -l` shows, in bytes here).
fn memlock_limit(limits: &str) -> Option<PageLockedLimit> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let soft = line
        .trim_start_matches("Max locked memory")
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        return Some(PageLockedLimit::Unlimited);
    }
    soft.parse().ok().map(PageLockedLimit::Rlimit)
}

/// The free space on the disk that holds `folder` (or will: the nearest folder above it that exists).
pub fn disk(folder: &Path) -> DiskFacts {
    let folder = std::path::absolute(folder).unwrap_or_else(|_| folder.to_path_buf());
    let mut facts = DiskFacts {
        folder: folder.clone(),
        mount_point: None,
        free_bytes: None,
        total_bytes: None,
        error: None,
    };
    let Some(existing) = folder.ancestors().find(|p| p.exists()) else {
        facts.error = Some("no folder on its path exists".into());
        return facts;
    };
    // Symbolic links are followed on Unix, where a folder may live on another disk than its path says; on
    // Windows, canonical paths carry a `\\?\` prefix that disk roots do not.
    let existing = if cfg!(windows) {
        existing.to_path_buf()
    } else {
        existing
            .canonicalize()
            .unwrap_or_else(|_| existing.to_path_buf())
    };
    match free_space(&existing) {
        Ok((mount, free, total)) => {
            facts.mount_point = Some(mount);
            facts.free_bytes = Some(free);
            facts.total_bytes = Some(total);
        }
        Err(err) => facts.error = Some(err),
    }
    facts
}

/// (mount point, free bytes, total bytes) of the disk holding the existing folder `path`.
#[cfg(feature = "telemetry")]
fn free_space(path: &Path) -> Result<(PathBuf, u64, u64), String> {
    let disks = sysinfo::Disks::new_with_refreshed_list()
        .map_err(|err| format!("the disks cannot be listed: {err}"))?;
    let listed: Vec<&Path> = disks.iter().map(|d| d.mount_point()).collect();
    let Some(mount) = mount_of(path, &listed) else {
        return Err("no disk holds this folder".into());
    };
    // sysinfo leaves out network and memory file systems (statvfs may hang on a dead NFS server): a folder there
    // would otherwise be matched with the disk mounted above it.
    #[cfg(target_os = "linux")]
    if let Some((real, fs_type)) = std::fs::read_to_string("/proc/self/mounts")
        .ok()
        .and_then(|text| linux_mount_of(path, &text))
    {
        if real != mount {
            return Err(format!(
                "not read on {fs_type} file systems (mounted at {})",
                real.display()
            ));
        }
    }
    let disk = disks
        .iter()
        .find(|d| d.mount_point() == mount)
        .ok_or_else(|| "no disk holds this folder".to_owned())?;
    Ok((
        mount.to_path_buf(),
        disk.available_space(),
        disk.total_space(),
    ))
}

#[cfg(not(feature = "telemetry"))]
fn free_space(_path: &Path) -> Result<(PathBuf, u64, u64), String> {
    Err("this build does not read the disks (built without the `telemetry` feature)".into())
}

/// The mount point among `mounts` that holds `path`: the longest one it starts with.
fn mount_of<'a>(path: &Path, mounts: &[&'a Path]) -> Option<&'a Path> {
    mounts
        .iter()
        .copied()
        .filter(|m| path.starts_with(m))
        .max_by_key(|m| m.components().count())
}

/// The mount point holding `path` and its file system type, from `/proc/self/mounts` (every mount, unfiltered).
#[cfg_attr(not(all(feature = "telemetry", target_os = "linux")), allow(dead_code))]
fn linux_mount_of(path: &Path, mounts: &str) -> Option<(PathBuf, String)> {
    let entries: Vec<(PathBuf, &str)> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _device = fields.next()?;
            let mount = unescape_mount(fields.next()?);
            Some((PathBuf::from(mount), fields.next()?))
        })
        .collect();
    let points: Vec<&Path> = entries.iter().map(|(p, _)| p.as_path()).collect();
    let mount = mount_of(path, &points)?;
    // A later mount on the same point hides the earlier ones.
    let (point, fs_type) = entries.iter().rev().find(|(p, _)| p == mount)?;
    Some((point.clone(), (*fs_type).to_owned()))
}

/// `/proc/self/mounts` writes space, tab, newline and backslash as octal escapes.
fn unescape_mount(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The process's memory mappings (Linux), to tell where each shared library was loaded from; empty elsewhere.
pub fn loaded_files() -> String {
    std::fs::read_to_string("/proc/self/maps").unwrap_or_default()
}

/// The first mapped file whose name starts with `prefix` (`libcublas.so` matches `libcublas.so.13.0.0.19`,
/// not `libcublasLt.so.13`).
pub fn loaded_path(maps: &str, prefix: &str) -> Option<PathBuf> {
    maps.lines()
        .filter_map(|line| line.find('/').map(|start| Path::new(&line[start..])))
        .find(|path| {
            path.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with(prefix))
        })
        .map(Path::to_path_buf)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const LIMITS: &str =
        "Limit                     Soft Limit           Hard Limit           Units     \n\
        Max cpu time              unlimited            unlimited            seconds   \n\
        Max locked memory         8388608              8388608              bytes     \n\
        Max address space         unlimited            unlimited            bytes     \n";

    #[test]
    fn the_memlock_limit_is_read_from_proc_limits() {
        assert_eq!(
            memlock_limit(LIMITS),
            Some(PageLockedLimit::Rlimit(8 << 20))
        );
        let unlimited = LIMITS.replace("8388608              8388608", "unlimited unlimited");
        assert_eq!(memlock_limit(&unlimited), Some(PageLockedLimit::Unlimited));
        assert_eq!(memlock_limit("Max cpu time unlimited"), None);
    }

    #[test]
    fn the_longest_mount_point_holds_a_path() {
        let mounts = [Path::new("/"), Path::new("/data"), Path::new("/data/fast")];
        assert_eq!(
            mount_of(Path::new("/data/fast/runs/out"), &mounts),
            Some(Path::new("/data/fast"))
        );
        // Whole components only: /datasets is not under /data.
        assert_eq!(
            mount_of(Path::new("/datasets/out"), &mounts),
            Some(Path::new("/"))
        );
        assert_eq!(mount_of(Path::new("relative"), &mounts), None);
    }

    #[test]
    fn proc_mounts_names_the_file_system_a_folder_is_on() {
        let mounts = "overlay / overlay rw,relatime 0 0\n\
            proc /proc proc rw 0 0\n\
            server:/export /home/me/my\\040runs nfs4 rw 0 0\n\
            /dev/sdb1 /data ext4 rw 0 0\n\
            tmpfs /data tmpfs rw 0 0\n";
        assert_eq!(
            linux_mount_of(Path::new("/home/me/my runs/out"), mounts),
            Some((PathBuf::from("/home/me/my runs"), "nfs4".into()))
        );
        assert_eq!(
            linux_mount_of(Path::new("/data/out"), mounts),
            Some((PathBuf::from("/data"), "tmpfs".into())),
            "the later mount hides the earlier"
        );
        assert_eq!(
            linux_mount_of(Path::new("/work"), mounts),
            Some((PathBuf::from("/"), "overlay".into()))
        );
    }

    #[test]
    fn a_library_is_found_in_the_mappings_by_its_file_name() {
        let maps = "7f00-7f10 r-xp 00000000 08:01 1234   /venv/nvidia/cu13/lib/libcublasLt.so.13\n\
            7f10-7f20 r-xp 00000000 08:01 1235   /venv/nvidia/cu13/lib/libcublas.so.13\n\
            7f20-7f30 rw-p 00000000 00:00 0 \n\
            7f30-7f40 r-xp 00000000 08:01 99     /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06\n";
        assert_eq!(
            loaded_path(maps, "libcublas.so"),
            Some(PathBuf::from("/venv/nvidia/cu13/lib/libcublas.so.13"))
        );
        assert_eq!(
            loaded_path(maps, "libcuda.so"),
            Some(PathBuf::from(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"
            ))
        );
        assert_eq!(loaded_path(maps, "libnvrtc.so"), None);
    }

    #[test]
    fn the_disk_of_a_folder_that_does_not_exist_yet_is_its_parents() {
        let dir = tempfile::tempdir().unwrap();
        let facts = disk(&dir.path().join("runs/out"));
        assert_eq!(facts.folder, dir.path().join("runs/out"));
        if cfg!(feature = "telemetry") {
            assert!(
                facts.free_bytes.is_some() || facts.error.is_some(),
                "{facts:?}"
            );
        } else {
            assert!(
                facts
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("telemetry")),
                "{facts:?}"
            );
        }
    }
}

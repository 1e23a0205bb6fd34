//! The memory budget (`--max-memory`, `AEP_MAX_MEMORY`): its `SIZE` syntax, and the
//! default derived from the host, as pure functions of the files' contents. Reading the
//! files is the I/O layer's (`io::host`).
//!
//! The default is half the memory the process may use: half the memory limit of its
//! cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`, the lowest along the path from
//! the process's cgroup to the hierarchy's root), or, with no limit, half the physical
//! memory (`MemTotal` of `/proc/meminfo`). The other half is left for what the budget
//! does not count: the program, its stacks, the allocator's slack and the kernel's
//! socket buffers.

use std::fmt;
use std::path::PathBuf;

/// The smallest budget accepted: below it the relay's fixed costs (its frame arenas, a
/// few connections) would keep it shedding for nothing.
pub const MIN_MAX_MEMORY: usize = 1 << 20;

/// A limit at or above this many bytes is "no limit" (cgroup v1 writes
/// `9223372036854771712`, a page-rounded `i64::MAX`, for an unlimited group).
const NO_LIMIT: u64 = 1 << 60;

/// Parses a `SIZE`: a number of bytes, or a number with a `KiB`, `MiB` or `GiB` suffix
/// (powers of 1024; a space before the suffix is allowed), at least [`MIN_MAX_MEMORY`].
///
/// # Errors
/// A message saying what is accepted, for anything else (`8MB`, `1.5GiB`, `-1`, an
/// overflow, a value under 1 MiB).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (number, suffix) = t.split_at(digits);
    let unit: usize = match suffix.trim_start() {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "`{s}` is not a size: a number of bytes, or a whole number with a KiB, MiB or GiB suffix (e.g. 64MiB)"
            ))
        }
    };
    let n: usize = number.parse().map_err(|_| {
        format!("`{s}` is not a size: a number of bytes, or a whole number with a KiB, MiB or GiB suffix (e.g. 64MiB)")
    })?;
    let bytes = n
        .checked_mul(unit)
        .ok_or_else(|| format!("`{s}` is too large"))?;
    if bytes < MIN_MAX_MEMORY {
        return Err(format!("`{s}` is below the smallest budget, 1MiB"));
    }
    Ok(bytes)
}

/// `n` bytes for a person: `64 MiB`, `1.5 GiB`, `512 bytes` (one decimal when not a
/// whole number of the unit).
pub fn format_size(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if n >= unit {
            return if n.is_multiple_of(unit) {
                format!("{} {name}", n / unit)
            } else {
                format!("{:.1} {name}", n as f64 / unit as f64)
            };
        }
    }
    format!("{n} bytes")
}

/// Where the budget in force came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BudgetSource {
    /// `--max-memory` or `AEP_MAX_MEMORY`.
    Flag,
    /// Half the memory limit of the process's cgroup (this many bytes).
    Cgroup(u64),
    /// Half the physical memory (`MemTotal`, this many bytes).
    Physical(u64),
    /// Neither a cgroup limit nor `MemTotal` could be read: no budget.
    Unknown,
}

/// The memory budget in force: how many bytes the relay may hold (`None`: unbounded)
/// and where that number came from. Displays as the start-up line says it, e.g.
/// `32 MiB (half the cgroup limit 64 MiB)`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes the relay may hold; `None` for no budget.
    pub bytes: Option<usize>,
    /// Where `bytes` came from.
    pub source: BudgetSource,
}

impl MemoryBudget {
    /// A budget set by `--max-memory`.
    pub fn flag(bytes: usize) -> MemoryBudget {
        MemoryBudget {
            bytes: Some(bytes),
            source: BudgetSource::Flag,
        }
    }

    /// The default for a host whose cgroup limit is `cgroup` (`None`: unlimited or
    /// unknown) and whose physical memory is `mem_total` bytes: half the one, else half
    /// the other, else no budget.
    pub fn derived(cgroup: Option<u64>, mem_total: Option<u64>) -> MemoryBudget {
        let half = |n: u64| Some(usize::try_from(n / 2).unwrap_or(usize::MAX));
        match (cgroup, mem_total) {
            (Some(limit), _) => MemoryBudget {
                bytes: half(limit),
                source: BudgetSource::Cgroup(limit),
            },
            (None, Some(total)) => MemoryBudget {
                bytes: half(total),
                source: BudgetSource::Physical(total),
            },
            (None, None) => MemoryBudget {
                bytes: None,
                source: BudgetSource::Unknown,
            },
        }
    }
}

impl fmt::Display for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bytes {
            Some(b) => write!(f, "{}", format_size(b as u64))?,
            None => f.write_str("unlimited")?,
        }
        match self.source {
            BudgetSource::Flag => f.write_str(" (--max-memory)"),
            BudgetSource::Cgroup(l) => write!(f, " (half the cgroup limit {})", format_size(l)),
            BudgetSource::Physical(t) => {
                write!(f, " (half the physical memory {})", format_size(t))
            }
            BudgetSource::Unknown => f.write_str(" (no cgroup limit or MemTotal found)"),
        }
    }
}

/// A cgroup memory-limit file to read: its path, and whether it is v2's `memory.max`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitFile {
    /// Where it is.
    pub path: PathBuf,
    /// `memory.max` (v2) rather than `memory.limit_in_bytes` (v1).
    pub v2: bool,
}

/// The memory-limit files that bound the process, from the contents of
/// `/proc/self/cgroup` and `/proc/self/mountinfo`: for the v2 hierarchy (line `0::PATH`)
/// and the v1 `memory` controller (line `N:...memory...:PATH`), each mounted, the file of
/// the process's cgroup and of each ancestor up to the mount's root, innermost first.
/// The limit in force is the lowest of those that read as a limit ([`parse_limit`]).
pub fn limit_files(cgroup: &str, mountinfo: &str) -> Vec<LimitFile> {
    let mut out = Vec::new();
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let v2 = controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "memory") {
            continue;
        }
        let Some((root, mount)) = mount_of(mountinfo, v2) else {
            continue;
        };
        // The cgroup path is relative to the hierarchy's root; the mount shows the
        // hierarchy from `root` down.
        let Some(rel) = path.strip_prefix(root.trim_end_matches('/')) else {
            continue;
        };
        let name = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        let mut dir = PathBuf::from(&mount);
        let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
        let mut dirs = vec![dir.clone()];
        for p in &parts {
            dir.push(p);
            dirs.push(dir.clone());
        }
        for d in dirs.into_iter().rev() {
            out.push(LimitFile {
                path: d.join(name),
                v2,
            });
        }
    }
    out
}

/// The `(root, mount point)` of the cgroup2 mount (`v2`) or of the v1 mount with the
/// `memory` controller, from `/proc/self/mountinfo`.
fn mount_of(mountinfo: &str, v2: bool) -> Option<(String, String)> {
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        let ok = if v2 {
            r[0] == "cgroup2"
        } else {
            r[0] == "cgroup" && r[2].split(',').any(|o| o == "memory")
        };
        if ok {
            return Some((unescape(l[3]), unescape(l[4])));
        }
    }
    None
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A memory-limit file's contents as a limit in bytes: `None` for `max` (v2), for a
/// value so large it means no limit (v1's unlimited is `9223372036854771712`), or for
/// anything unreadable.
pub fn parse_limit(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    (n > 0 && n < NO_LIMIT).then_some(n)
}

/// `MemTotal` of `/proc/meminfo`, in bytes (the file says kB, meaning KiB).
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut f = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = f.next()?.parse().ok()?;
    match f.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_bytes_kib_mib_gib() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("2048KiB"), Ok(2 << 20));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size(" 40 MiB "), Ok(40 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
    }

    #[test]
    fn anything_else_is_a_clear_error() {
        for bad in [
            "", "8MB", "8M", "8mib", "1.5GiB", "-1", "MiB", "8 MiB x", "0x10",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains("KiB, MiB or GiB"), "{bad:?}: {e}");
        }
        assert!(parse_size("99999999999999999999GiB").is_err());
        assert!(parse_size("18446744073709551615GiB")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("1023KiB").unwrap_err().contains("smallest"));
        assert!(parse_size("0").unwrap_err().contains("smallest"));
    }

    #[test]
    fn sizes_format_for_people() {
        assert_eq!(format_size(64 << 20), "64 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(512), "512 bytes");
    }

    const MOUNTINFO_V1: &str = "\
22 1 0:20 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 22 0:24 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
29 22 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
35 22 0:33 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const CGROUP_V1: &str = "\
9:name=systemd:/
4:memory:/process_api/5662
1:cpu:/
0::/
";

    #[test]
    fn v1_memory_files_from_the_cgroup_up_to_the_root() {
        let files = limit_files(CGROUP_V1, MOUNTINFO_V1);
        let v1: Vec<_> = files
            .iter()
            .filter(|f| !f.v2)
            .map(|f| f.path.to_str().unwrap().to_string())
            .collect();
        assert_eq!(
            v1,
            [
                "/sys/fs/cgroup/memory/process_api/5662/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            ]
        );
        // The hybrid layout's v2 hierarchy (no controllers) is listed too; its files
        // are absent and read as no limit.
        assert!(files
            .iter()
            .any(|f| f.v2 && f.path.to_str() == Some("/sys/fs/cgroup/unified/memory.max")));
    }

    #[test]
    fn v2_memory_max_with_a_namespaced_root() {
        let mountinfo =
            "30 23 0:26 /kubepods/pod1 /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let files = limit_files("0::/kubepods/pod1/c1\n", mountinfo);
        let paths: Vec<_> = files.iter().map(|f| f.path.to_str().unwrap()).collect();
        assert_eq!(
            paths,
            ["/sys/fs/cgroup/c1/memory.max", "/sys/fs/cgroup/memory.max"]
        );
        assert!(files.iter().all(|f| f.v2));
        // A mount point with a space, escaped.
        let mountinfo = "30 23 0:26 / /mnt/c\\040g rw - cgroup2 cgroup2 rw\n";
        let files = limit_files("0::/a\n", mountinfo);
        assert_eq!(files[0].path.to_str(), Some("/mnt/c g/a/memory.max"));
        // No cgroup mounted: nothing to read.
        assert!(limit_files("0::/a\n", "").is_empty());
    }

    #[test]
    fn limits_max_and_huge_are_none() {
        assert_eq!(parse_limit("67108864\n"), Some(64 << 20));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit(""), None);
        assert_eq!(parse_limit("0"), None);
    }

    #[test]
    fn mem_total_in_bytes() {
        let meminfo = "MemTotal:       24684204 kB\nMemFree:        22150472 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(24684204 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: x kB\n"), None);
    }

    #[test]
    fn the_default_is_half_the_cgroup_limit_else_half_the_memory() {
        let b = MemoryBudget::derived(Some(64 << 20), Some(24 << 30));
        assert_eq!(b.bytes, Some(32 << 20));
        assert_eq!(b.to_string(), "32 MiB (half the cgroup limit 64 MiB)");
        let b = MemoryBudget::derived(None, Some(24 << 30));
        assert_eq!(b.to_string(), "12 GiB (half the physical memory 24 GiB)");
        let b = MemoryBudget::derived(None, None);
        assert_eq!(b.bytes, None);
        assert_eq!(
            b.to_string(),
            "unlimited (no cgroup limit or MemTotal found)"
        );
        assert_eq!(
            MemoryBudget::flag(40 << 20).to_string(),
            "40 MiB (--max-memory)"
        );
    }

    #[test]
    fn a_configured_budget_under_1_mib_is_refused() {
        let c = crate::config::Config {
            max_memory: Some(MemoryBudget::flag(1000)),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().field.starts_with("max_memory"));
        let c = crate::config::Config {
            max_memory: Some(MemoryBudget::derived(None, None)),
            ..Default::default()
        };
        assert!(c.validate().is_ok(), "no budget is valid");
    }
}

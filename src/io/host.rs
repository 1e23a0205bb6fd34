//! What the host says about memory: the cgroup limit and the physical memory, read from
//! `/proc` and the cgroup file system for the default memory budget
//! ([`crate::config::memory`] parses what is read here).

use crate::config::memory::{self, MemoryBudget};

/// The default memory budget of this process: half its cgroup's memory limit (the
/// lowest along its cgroup path, v2 or v1), else half the physical memory, else none.
/// Files that cannot be read count as saying nothing.
pub fn memory_budget() -> MemoryBudget {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let files = memory::limit_files(&read("/proc/self/cgroup"), &read("/proc/self/mountinfo"));
    let cgroup = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(&f.path).ok())
        .filter_map(|text| memory::parse_limit(&text))
        .min();
    MemoryBudget::derived(cgroup, memory::parse_mem_total(&read("/proc/meminfo")))
}

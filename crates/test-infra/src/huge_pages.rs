//! The host's reserved 2 MiB huge pages, for the tests of `--hugepages`: they run the real
//! path, and fail saying what is missing where too few are free.

/// A field of /proc/meminfo (`HugePages_Total`, `HugePages_Free`).
fn meminfo(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// Fail the test unless `pages` huge pages are free.
pub fn require_free(pages: u64) {
    let free = meminfo("HugePages_Free");
    assert!(
        free >= pages,
        "this test needs {pages} free 2 MiB huge pages and the host has {free}: run scripts/setup.sh \
         (it reserves 64) or `echo 64 > /proc/sys/vm/nr_hugepages`"
    );
}

/// More huge pages than the host has reserved: a request for them must be refused.
pub fn more_than_reserved() -> u64 {
    meminfo("HugePages_Total") + 1
}

//! The migration stream, source to destination, on one Unix-socket connection (integers little
//! endian):
//!
//! - hello: `MAGIC`, then a u32 length and that many bytes of JSON ([`Hello`]: the VM's
//!   configuration and memory size); the destination answers with a reply once its VM is built;
//! - records, each a tag byte: [`TAG_PAGES`] then a u64 guest-physical address and a u32 page
//!   count, then the pages' bytes; [`TAG_STATE`] then a u32 length and a snapshot's state as
//!   JSON, which ends the stream; the destination answers with a reply once the state is
//!   applied and the guest is about to run;
//! - a reply: a status byte (0 accepted, 1 refused), a u32 length and a UTF-8 message.
//!
//! Every length, count and address is checked before it is used: a record may only name whole
//! pages inside one RAM region, no length exceeds its limit, and a short stream is an error.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use super::MigrationError;
use crate::snapshot::SavedConfig;

/// The first bytes of a stream: the format and its version.
pub const MAGIC: [u8; 8] = *b"EXLMIGR1";
/// A run of guest pages.
pub const TAG_PAGES: u8 = 1;
/// The VM's state; the last record.
pub const TAG_STATE: u8 = 2;
/// Bytes per page sent.
pub const PAGE: u64 = virtqueue::dirty::LOG_PAGE;
/// The most pages one record may carry (4 MiB).
pub const MAX_RECORD_PAGES: u32 = 1024;
/// The largest hello or state (a 64-vCPU VM's state is about 1.5 MiB).
pub const MAX_JSON: u32 = 16 << 20;
/// The longest reply message.
pub const MAX_REPLY: u32 = 4096;
/// The first byte of a TLS alert record, where a reply's status is: the stream went out plain
/// (`tcp+plain:`) to a destination that takes mutual TLS only.
const TLS_ALERT: u8 = 0x15;

/// What the source says first: enough for the destination to build the same machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The VM's configuration, as a snapshot records it.
    pub config: SavedConfig,
    /// Bytes of guest RAM.
    pub memory_bytes: u64,
}

/// One record of the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    /// `pages` pages at `gpa` follow (checked: page-aligned, 1 to `MAX_RECORD_PAGES`).
    Pages {
        /// Guest-physical address of the first page.
        gpa: u64,
        /// How many [`PAGE`]-byte pages, back to back.
        pages: u32,
    },
    /// The VM's state (JSON), the last record.
    State(Vec<u8>),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> MigrationError {
    move |source| MigrationError::Io { what, source }
}

fn bad(reason: impl Into<String>) -> MigrationError {
    MigrationError::Stream(reason.into())
}

fn read_u32(r: &mut impl Read, what: &'static str) -> Result<u32, MigrationError> {
    let mut bytes = [0u8; 4];
    r.read_exact(&mut bytes).map_err(io(what))?;
    Ok(u32::from_le_bytes(bytes))
}

/// A u32 length, then that many bytes (at most `max`) of `what` (`(noun, reading it)`).
fn read_sized(r: &mut impl Read, max: u32, what: (&str, &'static str)) -> Result<Vec<u8>, MigrationError> {
    let (noun, reading) = what;
    let len = read_u32(r, reading)?;
    if len > max {
        return Err(bad(format!("{noun} of {len} bytes, more than the {max} allowed")));
    }
    let mut bytes = vec![0u8; usize::try_from(len).map_err(|_| bad("length"))?];
    r.read_exact(&mut bytes).map_err(io(reading))?;
    Ok(bytes)
}

fn write_sized(w: &mut impl Write, bytes: &[u8], what: &'static str) -> Result<(), MigrationError> {
    let len = u32::try_from(bytes.len()).map_err(|_| bad(format!("{what} too large")))?;
    w.write_all(&len.to_le_bytes()).and_then(|()| w.write_all(bytes)).map_err(io(what))
}

/// Send the hello.
pub fn write_hello(w: &mut impl Write, hello: &Hello) -> Result<(), MigrationError> {
    let json = serde_json::to_vec(hello).map_err(|e| bad(e.to_string()))?;
    w.write_all(&MAGIC).map_err(io("sending the hello"))?;
    write_sized(w, &json, "sending the hello")
}

/// Read and check the hello (its configuration's counts included).
pub fn read_hello(r: &mut impl Read) -> Result<Hello, MigrationError> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(io("reading the hello"))?;
    if magic != MAGIC {
        return Err(bad(format!("it starts with {magic:02x?}, not an exitless migration ({MAGIC:02x?})")));
    }
    let json = read_sized(r, MAX_JSON, ("the hello", "reading the hello"))?;
    let hello: Hello = serde_json::from_slice(&json).map_err(|e| bad(format!("the hello: {e}")))?;
    hello.config.check()?;
    Ok(hello)
}

/// Send a reply: accepted, or refused with why.
pub fn write_reply(w: &mut impl Write, outcome: Result<(), &str>) -> Result<(), MigrationError> {
    let (status, message) = match outcome {
        Ok(()) => (0u8, ""),
        Err(why) => (1, why),
    };
    // A long message is cut (on a character boundary) rather than refused.
    let mut end = message.len().min(usize::try_from(MAX_REPLY).unwrap_or(0));
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    // One write: one segment on TCP, one record in TLS.
    let mut reply = vec![status];
    write_sized(&mut reply, &message.as_bytes()[..end], "sending a reply")?;
    w.write_all(&reply).and_then(|()| w.flush()).map_err(io("sending a reply"))
}

/// Read a reply: `Ok` if accepted, else the peer's reason.
pub fn read_reply(r: &mut impl Read, what: &'static str) -> Result<(), MigrationError> {
    let mut status = [0u8; 1];
    r.read_exact(&mut status).map_err(io(what))?;
    if status[0] == TLS_ALERT {
        return Err(bad(
            "the destination answered with a TLS alert: it takes mutual TLS only (send with tcp:IP:PORT \
             and --migration-tls-dir)",
        ));
    }
    let message = read_sized(r, MAX_REPLY, ("a reply", what))?;
    let message = String::from_utf8_lossy(&message).into_owned();
    match status[0] {
        0 => Ok(()),
        1 => Err(MigrationError::Refused(message)),

        other => Err(bad(format!("a reply of status {other}"))),
    }
}

/// Send a pages record's header; its `pages` pages follow.
pub fn write_pages_header(w: &mut impl Write, gpa: u64, pages: u32) -> Result<(), MigrationError> {
    let mut header = [0u8; 13];
    header[0] = TAG_PAGES;
    header[1..9].copy_from_slice(&gpa.to_le_bytes());
    header[9..].copy_from_slice(&pages.to_le_bytes());
    w.write_all(&header).map_err(io("sending pages"))
}

/// Send the state record.
pub fn write_state(w: &mut impl Write, json: &[u8]) -> Result<(), MigrationError> {
    w.write_all(&[TAG_STATE]).map_err(io("sending the state"))?;
    write_sized(w, json, "sending the state")?;
    w.flush().map_err(io("sending the state"))
}

/// Read the next record's header (a state record whole); a pages record's data is the
/// caller's to read.
pub fn read_record(r: &mut impl Read) -> Result<Record, MigrationError> {
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag).map_err(io("reading a record"))?;
    match tag[0] {
        TAG_PAGES => {
            let mut header = [0u8; 12];
            r.read_exact(&mut header).map_err(io("reading a pages record"))?;
            let gpa = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
            let pages = u32::from_le_bytes(header[8..].try_into().unwrap_or_default());
            if !gpa.is_multiple_of(PAGE) {
                return Err(bad(format!("pages at {gpa:#x}, not a page boundary")));
            }
            if pages == 0 || pages > MAX_RECORD_PAGES {
                return Err(bad(format!("a record of {pages} pages (1 to {MAX_RECORD_PAGES})")));
            }
            Ok(Record::Pages { gpa, pages })
        }
        TAG_STATE => Ok(Record::State(read_sized(r, MAX_JSON, ("the state", "reading the state"))?)),
        other => Err(bad(format!("a record of unknown kind {other}"))),
    }
}

/// What [`parse_stream`] found in a stream the destination would have taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedStream {
    /// The hello.
    pub hello: Hello,
    /// Page records.
    pub records: u64,
    /// Pages in them.
    pub pages: u64,
    /// The state record's vCPU states (checked against the hello's configuration).
    pub vcpus: usize,
    /// The state record's device states (checked against the hello's configuration).
    pub devices: usize,
}

/// Do `len` bytes at guest address `gpa` lie whole inside one of `regions` (start, length)? A
/// page record is refused, before a byte of it is written, unless they do.
pub(crate) fn inside_one_region(regions: impl IntoIterator<Item = (u64, u64)>, gpa: u64, len: u64) -> bool {
    gpa.checked_add(len)
        .is_some_and(|end| regions.into_iter().any(|(start, size)| gpa >= start && end - start <= size))
}

/// Read a whole migration stream from `r` as the destination reads it, without building a VM:
/// the hello (its configuration checked and made into a VM configuration, its memory size
/// against the RAM that configuration lays out), each page record against that layout (whole
/// pages inside one RAM region; the pages themselves read and dropped), and the state record
/// (checked as a restore checks a snapshot's state, and against the hello). Parsing only: no VM,
/// no guest memory, no reply; the first bad byte is an error, as it is for `receive`, which makes
/// the same checks on a live connection. For fuzzing the receiver's parsing.
pub fn parse_stream(r: &mut impl Read) -> Result<ParsedStream, MigrationError> {
    let hello = read_hello(r)?;
    let config = hello.config.to_vm_config(hello.config.base_naming_saved_devices())?;
    let ranges = crate::memory::ram_ranges(config.mem_bytes);
    let total: u64 = ranges.iter().map(|&(_, len)| len).sum();
    if total != hello.memory_bytes {
        return Err(bad(format!(
            "the hello says {} bytes of guest memory, its configuration {total}",
            hello.memory_bytes
        )));
    }
    let (mut records, mut pages_taken) = (0, 0);
    loop {
        match read_record(r)? {
            Record::Pages { gpa, pages } => {
                let len = u64::from(pages) * PAGE;
                if !inside_one_region(ranges.iter().map(|&(start, size)| (start.0, size)), gpa, len) {
                    return Err(bad(format!("{pages} pages at {gpa:#x} are not inside guest memory")));
                }
                let read =
                    std::io::copy(&mut r.take(len), &mut std::io::sink()).map_err(io("reading pages"))?;
                if read != len {
                    let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                    return Err(io("reading pages")(eof));
                }
                records += 1;
                pages_taken += u64::from(pages);
            }
            Record::State(json) => {
                let snapshot = crate::snapshot::Snapshot::parse(&json, std::path::Path::new("the stream"))?;
                if snapshot.config != hello.config || snapshot.memory_bytes != hello.memory_bytes {
                    return Err(bad("the state describes another machine than the hello"));
                }
                let (vcpus, devices) = (snapshot.vcpus.len(), snapshot.devices.len());
                return Ok(ParsedStream { hello, records, pages: pages_taken, vcpus, devices });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let mut stream = Vec::new();
        write_pages_header(&mut stream, 0x3000, 2).unwrap();
        write_state(&mut stream, b"{}").unwrap();
        let mut r = stream.as_slice();
        assert_eq!(read_record(&mut r).unwrap(), Record::Pages { gpa: 0x3000, pages: 2 });
        assert_eq!(read_record(&mut r).unwrap(), Record::State(b"{}".to_vec()));
        assert!(matches!(read_record(&mut r), Err(MigrationError::Io { .. })));

        let refused = |bytes: &[u8]| read_record(&mut &bytes[..]).unwrap_err().to_string();
        let mut unaligned = Vec::new();
        write_pages_header(&mut unaligned, 0x3001, 1).unwrap();
        assert!(refused(&unaligned).contains("page boundary"));
        let mut many = Vec::new();
        write_pages_header(&mut many, 0, MAX_RECORD_PAGES + 1).unwrap();
        assert!(refused(&many).contains("pages"));
        assert!(refused(&[TAG_STATE, 0xff, 0xff, 0xff, 0xff]).contains("more than"));
        assert!(refused(&[9]).contains("unknown kind"));
        assert!(refused(&[TAG_PAGES, 0, 0]).contains("connection broke"));
    }

    /// A VM of `mem_bytes` and one vCPU, no disk: its hello's configuration.
    fn config(mem_bytes: u64) -> SavedConfig {
        SavedConfig {
            mem_bytes,
            vcpus: 1,
            hugepages: false,
            cmdline: String::new(),
            io_mode: "eventfd".into(),
            idle_budget_us: 50,
            disable_hlt_exits: false,
            disable_pause_exits: false,
            disks: Vec::new(),
            nets: Vec::new(),
            vhost_user_nets: Vec::new(),
            testdev: false,
        }
    }

    /// The state record's JSON for `config` (KVM's structures zeroed: only parsed here).
    fn state(config: &SavedConfig, memory_bytes: u64) -> Vec<u8> {
        use crate::snapshot::{Snapshot, VcpuState, VmState, FORMAT, VERSION};
        let snapshot = Snapshot {
            format: FORMAT.into(),
            version: VERSION,
            config: config.clone(),
            memory_bytes,
            tsc_khz: 1_000_000,
            vm: VmState {
                clock: Default::default(),
                pic_master: Default::default(),
                pic_slave: Default::default(),
                ioapic: Default::default(),
            },
            vcpus: vec![VcpuState {
                index: 0,
                regs: Default::default(),
                sregs: Default::default(),
                msrs: Vec::new(),
                lapic: Default::default(),
                xsave: Default::default(),
                events: Default::default(),
                xcrs: Default::default(),
                mp_state: Default::default(),
                debugregs: Default::default(),
            }],
            devices: Vec::new(),
        };
        serde_json::to_vec(&snapshot).unwrap()
    }

    /// A stream: the hello for `config` (saying `memory_bytes`), `records` of zero pages, the
    /// state `state`.
    fn stream(config: &SavedConfig, memory_bytes: u64, records: &[(u64, u32)], state: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_hello(&mut out, &Hello { config: config.clone(), memory_bytes }).unwrap();
        for &(gpa, pages) in records {
            write_pages_header(&mut out, gpa, pages).unwrap();
            out.resize(out.len() + pages as usize * PAGE as usize, 0);
        }
        write_state(&mut out, state).unwrap();
        out
    }

    #[test]
    fn a_whole_stream_parses_as_the_destination_reads_it_and_bad_ones_are_refused() {
        const MIB: u64 = 1 << 20;
        let small = config(64 * MIB);
        let good = stream(&small, 64 * MIB, &[(0x1000, 2), (64 * MIB - PAGE, 1)], &state(&small, 64 * MIB));
        let parsed = parse_stream(&mut good.as_slice()).unwrap();
        assert_eq!((parsed.records, parsed.pages, parsed.vcpus, parsed.devices), (2, 3, 1, 0));
        assert_eq!(parsed.hello.config, small);

        let refused = |bytes: Vec<u8>| parse_stream(&mut bytes.as_slice()).unwrap_err().to_string();
        let state_small = state(&small, 64 * MIB);
        // A page past the end of RAM, and one straddling it.
        assert!(refused(stream(&small, 64 * MIB, &[(64 * MIB, 1)], &state_small)).contains("not inside"));
        assert!(
            refused(stream(&small, 64 * MIB, &[(64 * MIB - PAGE, 2)], &state_small)).contains("not inside")
        );
        // Above 3 GiB, RAM continues at 4 GiB: the MMIO hole between is no RAM.
        let large = config(5 << 30);
        let state_large = state(&large, 5 << 30);
        let hole = [(3 << 30, 1)];
        assert!(refused(stream(&large, 5 << 30, &hole, &state_large)).contains("not inside"));
        let across = [((3 << 30) - PAGE, 2)];
        assert!(refused(stream(&large, 5 << 30, &across, &state_large)).contains("not inside"));
        let above = [(4 << 30, 1), ((5 << 30) + (1 << 30) - PAGE, 1)];
        assert_eq!(
            parse_stream(&mut stream(&large, 5 << 30, &above, &state_large).as_slice()).unwrap().pages,
            2
        );
        // The hello's memory size against its configuration's; the state against the hello.
        assert!(refused(stream(&small, 32 * MIB, &[], &state(&small, 32 * MIB))).contains("guest memory"));
        assert!(refused(stream(&small, 64 * MIB, &[], &state(&config(128 * MIB), 128 * MIB)))
            .contains("another machine"));
        // Pages cut short, and a stream that ends before its state.
        let mut short = stream(&small, 64 * MIB, &[(0, 2)], &state_small);
        short.truncate(short.len() - state_small.len() - 5 - 100);
        assert!(refused(short).contains("connection broke"));
    }

    #[test]
    fn replies_carry_their_reason() {
        let mut stream = Vec::new();
        write_reply(&mut stream, Ok(())).unwrap();
        write_reply(&mut stream, Err("no disk")).unwrap();
        let mut r = stream.as_slice();
        read_reply(&mut r, "test").unwrap();
        assert!(read_reply(&mut r, "test").unwrap_err().to_string().contains("no disk"));
        assert!(read_hello(&mut &b"EXLMIGR0\0\0\0\0"[..])
            .unwrap_err()
            .to_string()
            .contains("not an exitless"));
    }
}

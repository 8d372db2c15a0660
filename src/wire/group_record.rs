//! The group records of an IGMPv3 report (RFC 3376 4.2.4) or an MLDv2 report (RFC 3810
//! 5.2.1): one layout for both, with 4-byte or 16-byte addresses.

use std::net::IpAddr;

/// What a group record says about the sender's interest (RFC 3376 4.2.12, RFC 3810 5.2.12);
/// v1/v2 reports read as `IsExclude` with no sources, leaves and MLD done as `ToInclude`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    IsInclude,
    IsExclude,
    ToInclude,
    ToExclude,
    Allow,
    Block,
}

impl RecordKind {
    fn from_type(t: u8) -> Option<Self> {
        Some(match t {
            1 => RecordKind::IsInclude,
            2 => RecordKind::IsExclude,
            3 => RecordKind::ToInclude,
            4 => RecordKind::ToExclude,
            5 => RecordKind::Allow,
            6 => RecordKind::Block,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    pub kind: RecordKind,
    pub group: IpAddr,
    pub sources: Vec<IpAddr>,
}

/// Where each field of a group record lies, named once; the multicast address starts at
/// `ADDRESS` and the sources follow it, each as long as it.
pub mod field {
    use std::ops::Range;

    pub const TYPE: usize = 0;
    pub const AUX_LEN: usize = 1;
    pub const SOURCES: Range<usize> = 2..4;
    pub const ADDRESS: usize = 4;
}

/// The one record a v1/v2 report or leave stands for: `kind` of `group`, no sources; none
/// if the address is no group.
pub fn single(kind: RecordKind, group: IpAddr) -> Option<Vec<GroupRecord>> {
    group.is_multicast().then(|| {
        vec![GroupRecord {
            kind,
            group,
            sources: Vec::new(),
        }]
    })
}

/// The records of a v3 or v2 report `m`: their count in the 16 bits at `count`, the records
/// from `first` on, addresses `alen` bytes long.
pub fn counted(
    m: &[u8],
    count: std::ops::Range<usize>,
    first: usize,
    alen: usize,
    addr: fn(&[u8]) -> IpAddr,
) -> Option<Vec<GroupRecord>> {
    let n = m.get(count)?;
    let n = usize::from(u16::from_be_bytes([n[0], n[1]]));
    parse(m.get(first..)?, n, alen, addr)
}

/// `n` records from the start of `b`, each address `alen` bytes (`addr` reads one). `None`
/// if a record runs past `b` or has an unknown type. A record for an address that is no
/// group says nothing a filter can follow (the multicast address field, RFC 3376 4.2.12,
/// RFC 3810 5.2.12): it is skipped, and the rest of the report stands.
pub fn parse(b: &[u8], n: usize, alen: usize, addr: fn(&[u8]) -> IpAddr) -> Option<Vec<GroupRecord>> {
    let mut at = 0usize;
    let mut out = Vec::with_capacity(n.min(256));
    for _ in 0..n {
        let r = b.get(at..)?;
        let kind = RecordKind::from_type(*r.get(field::TYPE)?)?;
        let aux = usize::from(*r.get(field::AUX_LEN)?) * 4;
        let s = r.get(field::SOURCES)?;
        let nsrc = usize::from(u16::from_be_bytes([s[0], s[1]]));
        let len = field::ADDRESS + alen * (nsrc + 1);
        let addrs = r.get(field::ADDRESS..len)?;
        let group = addr(&addrs[..alen]);
        let sources = addrs[alen..].chunks_exact(alen).map(addr).collect();
        if group.is_multicast() {
            out.push(GroupRecord { kind, group, sources });
        }
        at = at.checked_add(len + aux)?;
    }
    Some(out)
}

//! Zero-copy views of on-the-wire formats and checksums. No I/O.
//!
//! Untrusted bytes enter only through `new_checked` constructors, which validate lengths
//! once so that the accessors can index without further checks.

#![forbid(unsafe_code)]

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod group_record;
pub mod icmp;
pub mod icmpv6;
pub mod igmp;
pub mod ip;
pub mod layers;
pub mod mcast_report;
pub mod mld;
pub mod virtio_net_hdr;

pub use ethernet::{EthernetFrame, MacAddr};
pub use virtio_net_hdr::VirtioNetHdr;

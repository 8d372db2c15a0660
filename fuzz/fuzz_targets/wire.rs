//! Every parser a guest's frame reaches on its own: Ethernet, IPv4, IPv6 and its extension
//! headers, ARP, neighbour discovery, IGMP/MLD reports. Beyond "no panic": what a view
//! accepts lies inside the bytes it was given, and a report names only multicast groups.
#![no_main]

use dpaa_vnic::wire::arp::ArpPacket;
use dpaa_vnic::wire::ip::{self, Ipv4Packet, Ipv6Packet, Ipv6Upper};
use dpaa_vnic::wire::layers::{Layers, Network};
use dpaa_vnic::wire::{mcast_report, icmpv6, EthernetFrame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(eth) = EthernetFrame::new_checked(data) {
        let _ = (eth.dst(), eth.src());
    }
    if let Some((_, off)) = ip::network_offset(data) {
        assert!(off <= data.len());
    }
    if let Ok(p) = Ipv4Packet::new_checked(data) {
        assert!(p.header_len() >= 20 && p.header_len() <= data.len());
        let _ = (p.total_len(), p.dst(), p.protocol(), p.is_later_fragment());
    }
    if let Ok(p) = Ipv6Packet::new_checked(data) {
        let _ = p.upper();
    }
    if let Ok(a) = ArpPacket::new_checked(data) {
        let _ = (a.op(), a.sender_ip(), a.sender_mac(), a.target_ip());
    }
    if let Some((&hop_limit, icmp)) = data.split_first() {
        let _ = icmpv6::parse_neighbour(hop_limit, icmp);
    }
    // The layers the pipeline keeps: where it puts the network header and IPv6's upper
    // layer lies inside the frame, and it agrees with the views' own answers.
    let l = Layers::parse(data);
    assert_eq!(l.l3(), ip::network_offset(data));
    if let Some(ip) = l.ip(data) {
        match l.network {
            Network::V4 => assert!(Ipv4Packet::new_checked(ip).is_ok()),
            Network::V6 => {
                assert_eq!(l.upper(), Ipv6Packet::new_checked(ip).ok().and_then(|p| p.upper().ok()));
                if let Some(Ipv6Upper::Found { offset, .. }) = l.upper() {
                    assert!(offset <= ip.len());
                }
            }
            Network::BadV4 => assert!(Ipv4Packet::new_checked(ip).is_err()),
            Network::BadV6 => assert!(Ipv6Packet::new_checked(ip).is_err()),
            Network::Other => {}
        }
    }
    if mcast_report::maybe_report(data) {
        let _ = mcast_report::is_report(data);
    }
    if let Some(report) = mcast_report::parse(data) {
        for r in &report.records {
            assert!(r.group.is_multicast(), "report for a non-group {}", r.group);
        }
    }
});

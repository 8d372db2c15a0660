//! The frame buffers one forwarding worker owns.

/// Frame buffers, grown once and then reused, so forwarding allocates nothing per packet
/// once warm. Each worker (a vhost-user queue thread, a tap queue thread) owns one and lends
/// it down the path in its [`Ingress`](super::Ingress); nothing else in the pipeline keeps
/// a frame buffer, and none is shared or locked.
#[derive(Debug, Default)]
pub struct Buffers {
    /// A frame the router originates: an ARP or ND answer or request, an ICMP error.
    pub originated: Vec<u8>,
    /// A flooded frame's copy for a port whose egress actions rewrite it, so that the ports
    /// after it get the frame as it entered.
    pub egress_copy: Vec<u8>,
    /// One GSO segment at a time, for a port that cannot take a frame whole.
    pub segment: Vec<u8>,
}

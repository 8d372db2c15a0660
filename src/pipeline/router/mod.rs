//! The L3 router inside the switch: router interfaces (`--router-ip`), static routes
//! (`--route`, `ctl route`), neighbours learned from ARP and NDP, and the per-queue route
//! cache.
//!
//! The interfaces and routes live in the rules snapshot ([`super::rules::Rules`]); every
//! change publishes a new snapshot with a new generation. Neighbours have a table of their
//! own ([`Neighbours`]) with a generation of its own. Each queue worker keeps its own
//! [`RouteCache`] of resolved destinations and drops it whole when either generation
//! moves: Linux's per-CPU cached output route, with a generation number instead of a
//! refcount.
//!
//! - `spec`: the configuration syntax;
//! - `lpm` and `table`: longest-prefix match and the table resolved against neighbours;
//! - `neigh`: the neighbour table, bounded per port and aged;
//! - `cache`: a worker's cache of resolved routes;
//! - `forward`: what happens to a frame, with one skeleton for both IP versions; `ipv4`
//!   (with ARP) and `ipv6` (with neighbour discovery) supply what differs.

mod cache;
mod forward;
mod ipv4;
mod ipv6;
mod lpm;
pub mod neigh;
mod spec;
mod table;

pub use cache::RouteCache;
pub use forward::{handle, Outcome, Step};
pub use neigh::Neighbours;
pub use spec::{NextHop, Route, RouteParseError, RouterIf};
pub use table::{Resolution, RouteTable};

use crate::wire::MacAddr;

/// The router's MAC on every port ("vnic" in the low octets, locally administered).
pub const ROUTER_MAC: MacAddr = MacAddr([0x02, 0x76, 0x6e, 0x69, 0x63, 0x01]);

/// What a worker resolves against: the rules' router table, the neighbours, and the
/// generation its route cache must hold ([`cache_generation`]).
pub struct Lookup<'a> {
    pub table: &'a RouteTable,
    pub neigh: &'a Neighbours,
    pub generation: u64,
}

/// The generation a route cache follows: the rules' (bumped by every published change)
/// and the neighbours' (bumped when one changes or ages out), in one word. The rules'
/// count would need 2^40 published changes to reach the neighbours' bits.
pub fn cache_generation(rules: u64, neigh: u64) -> u64 {
    rules.wrapping_add(neigh << 40)
}

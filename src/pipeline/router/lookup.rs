//! What a worker routes by: the router's MAC, the tables, and the generation its route
//! cache follows.

use super::cache::SharedRouteCache;
use super::neigh::Neighbours;
use super::table::RouteTable;
use crate::wire::MacAddr;

/// The router's MAC on every port ("vnic" in the low octets, locally administered).
pub const ROUTER_MAC: MacAddr = MacAddr([0x02, 0x76, 0x6e, 0x69, 0x63, 0x01]);

/// What a worker resolves against: the rules' router table, the neighbours, and the
/// generation its route cache must hold ([`cache_generation`]).
pub struct Lookup<'a> {
    pub table: &'a RouteTable,
    pub neigh: &'a Neighbours,
    pub generation: u64,
    /// `--route-cache shared`: the one cache every worker uses instead of its own.
    pub shared: Option<&'a SharedRouteCache>,
}

/// The generation a route cache follows: the rules' (bumped by every published change)
/// and the neighbours' (bumped when one changes or ages out), in one word. The rules'
/// count would need 2^40 published changes to reach the neighbours' bits.
pub fn cache_generation(rules: u64, neigh: u64) -> u64 {
    rules.wrapping_add(neigh << 40)
}

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
//! - `cache`: a worker's cache of resolved routes (and the shared one of `--route-cache
//!   shared`, the seed's "before", kept to measure against);
//! - `dispatch`: which of the two versions a frame goes to;
//! - `forward`: what happens to a routed frame, with one skeleton for both IP versions;
//!   `ipv4` (with ARP) and `ipv6` (with neighbour discovery) supply what differs.

mod cache;
mod dispatch;
mod forward;
mod ipv4;
mod ipv6;
mod lookup;
mod lpm;
pub mod neigh;
mod spec;
mod table;

pub use cache::{RouteCache, SharedRouteCache};
pub use dispatch::{handle, switches_only};
pub use forward::{Outcome, Step};
pub use lookup::{cache_generation, Lookup, ROUTER_MAC};
pub use neigh::Neighbours;
pub use spec::{NextHop, Route, RouteParseError, RouterIf};
pub use table::{Resolution, RouteTable};

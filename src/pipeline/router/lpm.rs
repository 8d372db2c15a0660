//! Longest-prefix match over the router's connected prefixes and static routes.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

/// Where a prefix leads: the egress port, and the gateway (`None`: on-link, the
/// destination is its own next hop).
pub(super) type Target = (usize, Option<IpAddr>);

/// Longest-prefix match by prefix length: one hash map per length in use, longest first,
/// so a lookup costs one probe per distinct length (a handful), not one per route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Lpm {
    v4: Vec<(u8, HashMap<IpNet, Target>)>,
    v6: Vec<(u8, HashMap<IpNet, Target>)>,
}

impl Lpm {
    pub(super) fn insert(&mut self, net: IpNet, t: Target, replace: bool) {
        let levels = if matches!(net, IpNet::V4(_)) {
            &mut self.v4
        } else {
            &mut self.v6
        };
        let len = net.prefix_len();
        let i = match levels.iter().position(|(l, _)| *l <= len) {
            Some(i) if levels[i].0 == len => i,
            Some(i) => {
                levels.insert(i, (len, HashMap::new()));
                i
            }
            None => {
                levels.push((len, HashMap::new()));
                levels.len() - 1
            }
        };
        let map = &mut levels[i].1;
        if replace || !map.contains_key(&net.trunc()) {
            map.insert(net.trunc(), t);
        }
    }

    pub(super) fn lookup(&self, dst: IpAddr) -> Option<Target> {
        let levels = if dst.is_ipv4() { &self.v4 } else { &self.v6 };
        levels
            .iter()
            .find_map(|(len, map)| map.get(&IpNet::new(dst, *len).ok()?.trunc()).copied())
    }
}

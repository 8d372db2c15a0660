//! A guest port served over vhost-user in the test's own process, as the daemon serves one,
//! attached to a switch the test holds. Each test binary uses what it needs.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dpaa_vnic::device::filter::Layout;
use dpaa_vnic::device::NetConfig;
use dpaa_vnic::pipeline::Switch;
use dpaa_vnic::ports::poll::PollGroup;
use dpaa_vnic::ports::vhost_user::{self, FilterConfig, GuestPort, Snooping};

/// What [`serve_port`] sets up beyond the defaults: the control thread's poll window
/// (`--ctrl-poll-us`; `None`, the daemon's), the TX worker's (`--tx-poll-us`), snooping,
/// a poll group to serve the TX queue.
#[derive(Default)]
pub struct PortOpts {
    pub ctrl_poll: Option<Duration>,
    pub tx_poll: Option<Duration>,
    pub snoop: Snooping,
    pub poll: Option<Arc<PollGroup>>,
}

/// Port `id` of `switch`, MAC 52:54:00:d0:aa:(id + 1), one queue pair, a MEMAC filter,
/// listening at `path` on a thread of its own.
pub fn serve_port(switch: &Arc<Switch>, id: usize, path: &Path, opts: PortOpts) -> Arc<GuestPort> {
    let cfg = NetConfig {
        mac: format!("52:54:00:d0:aa:{:02x}", id + 1).parse().unwrap(),
        link_up: true,
        announce: false,
        max_queue_pairs: 1,
        mtu: 1500,
    };
    let filter = FilterConfig {
        layout: Layout::Memac,
        exact_limit: 4096,
        snoop: opts.snoop,
        snoop_max_groups: 16_384,
    };
    let mut port = GuestPort::new(id, path.to_path_buf(), 1, cfg, filter, switch.clone());
    if let Some(poll) = opts.ctrl_poll {
        port = port.with_ctrl_poll(poll);
    }
    if let Some(poll) = opts.tx_poll {
        port = port.with_tx_poll(poll);
    }
    let port = Arc::new(match opts.poll {
        Some(group) => port.with_poll(group),
        None => port,
    });
    switch.attach(id, port.clone());
    let bound = port.bind(Default::default()).unwrap();
    let p = port.clone();
    thread::spawn(move || {
        let _claim = bound.claim;
        vhost_user::serve(p, bound.listener, dpaa_vnic::stop::Stop::default())
    });
    port
}

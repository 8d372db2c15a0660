//! A line on the control socket, as any local client may send it, and the option specs it
//! carries or the command line takes (checksum actions, routes, router interfaces, filter
//! layouts, MAC locks, QMP sockets, MACs). Invariants: every answer is one JSON object, and a
//! spec that parses prints back to the same spec.
#![no_main]

use std::sync::Arc;

use dpaa_vnic::control::qmp::QmpSpec;
use dpaa_vnic::control::server::answer;
use dpaa_vnic::control::view::{Daemon, Started};
use dpaa_vnic::device::filter::Layout;
use dpaa_vnic::pipeline::csum_action::CsumAction;
use dpaa_vnic::pipeline::router::{Route, RouterIf};
use dpaa_vnic::pipeline::source_lock::MacLock;
use dpaa_vnic::pipeline::Switch;
use dpaa_vnic::wire::MacAddr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let d = Daemon {
        ports: Vec::new(),
        switch: Arc::new(Switch::new(2)),
        refused: Default::default(),
        started: Started::now(Vec::new()),
        poll: None,
        qmp: Default::default(),
        queue_cpus: Default::default(),
    };
    let reply = answer(&d, line);
    let v: serde_json::Value = serde_json::from_str(&reply).expect("the answer is JSON");
    assert!(v.is_object());
    assert!(!reply.contains('\n'), "one line per answer");
    if let Ok(a) = line.parse::<CsumAction>() {
        assert_eq!(a.to_string().parse::<CsumAction>().ok(), Some(a));
    }
    if let Ok(r) = line.parse::<Route>() {
        assert_eq!(r.to_string().parse::<Route>().ok(), Some(r));
    }
    if let Ok(i) = line.parse::<RouterIf>() {
        assert_eq!(i.to_string().parse::<RouterIf>().ok(), Some(i));
    }
    if let Ok(l) = line.parse::<Layout>() {
        assert_eq!(l.to_string().parse::<Layout>().ok(), Some(l));
    }
    if let Ok(l) = line.parse::<MacLock>() {
        assert_eq!(l.to_string().parse::<MacLock>().ok(), Some(l));
    }
    // No printed form to compare: parsing alone must hold.
    let _ = line.parse::<QmpSpec>();
    let _ = line.parse::<MacAddr>();
});

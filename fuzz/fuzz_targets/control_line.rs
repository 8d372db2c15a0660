//! A line on the control socket, as any local client may send it, and the option specs it
//! carries (checksum actions, routes). Invariants: every answer is one JSON object, and a
//! spec that parses prints back to the same spec.
#![no_main]

use std::sync::Arc;

use dpaa_vnic::control::server::{answer, Daemon};
use dpaa_vnic::pipeline::csum_action::CsumAction;
use dpaa_vnic::pipeline::router::{Route, RouterIf};
use dpaa_vnic::pipeline::Switch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let d = Daemon {
        ports: Vec::new(),
        switch: Arc::new(Switch::new(2)),
        refused: Default::default(),
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
});

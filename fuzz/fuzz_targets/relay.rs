//! What a frontend sends the vhost-user relay: messages read from a byte stream until it
//! ends or a message is refused (oversized, truncated, regions or ring descriptors without
//! the files they name). Invariant, checked inside: no body larger than the vhost crate
//! accepts is ever read.
#![no_main]

use dpaa_vnic::ports::vhost_user::relay;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = relay::read_all(data);
});

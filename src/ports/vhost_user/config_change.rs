//! The device attachment's config space as it changes (the link, an announce), and the
//! message that says so: VHOST_USER_BACKEND_CONFIG_CHANGE_MSG on the channel the frontend
//! gave (SET_BACKEND_REQ_FD, which the relay keeps for the port). QEMU's vhost-user device
//! then reads the config space again and raises the guest's config interrupt (QEMU 10.2,
//! hw/virtio/vhost-user-base.c, `vub_config_notifier`). In the net attachment QEMU's own
//! virtio-net serves the config space, so there `ctl link` and `ctl announce` go through
//! `--qmp` instead.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use thiserror::Error;
use vhost::vhost_user::message::BackendReq;

#[derive(Debug, Error)]
pub enum ConfigChangeError {
    #[error("the frontend gave no channel for config changes (it did not negotiate VHOST_USER_PROTOCOL_F_BACKEND_REQ, or no frontend is attached)")]
    NoChannel,
    #[error("the driver did not negotiate VIRTIO_NET_F_GUEST_ANNOUNCE")]
    NoAnnounce,
    #[error("telling the frontend the config space changed")]
    Write(#[source] io::Error),
}

/// The parts of a port's config space that change while it runs, and the channel to say so.
#[derive(Debug)]
pub struct LiveStatus {
    link_up: AtomicBool,
    announce: AtomicBool,
    channel: Mutex<Option<UnixStream>>,
}

impl Default for LiveStatus {
    fn default() -> Self {
        LiveStatus {
            link_up: AtomicBool::new(true),
            announce: AtomicBool::new(false),
            channel: Mutex::new(None),
        }
    }
}

impl LiveStatus {
    /// VIRTIO_NET_S_LINK_UP as the port serves it.
    pub fn link_up(&self) -> bool {
        self.link_up.load(Ordering::Relaxed)
    }

    /// VIRTIO_NET_S_ANNOUNCE as the port serves it.
    pub fn announcing(&self) -> bool {
        self.announce.load(Ordering::Relaxed)
    }

    /// The frontend's channel, or none once it is gone.
    pub fn set_channel(&self, channel: Option<UnixStream>) {
        *crate::sync::lock(&self.channel) = channel;
    }

    /// Sets the link and tells the frontend. The link stays as set even if the frontend
    /// cannot be told: the next driver reads it from config space.
    pub fn set_link(&self, up: bool) -> Result<(), ConfigChangeError> {
        self.link_up.store(up, Ordering::Relaxed);
        self.changed()
    }

    /// Asks the driver to announce itself (`guest_announce`: it negotiated the feature).
    pub fn announce(&self, guest_announce: bool) -> Result<(), ConfigChangeError> {
        if !guest_announce {
            return Err(ConfigChangeError::NoAnnounce);
        }
        self.announce.store(true, Ordering::Relaxed);
        self.changed()
    }

    /// The driver's ANNOUNCE_ACK, or a reset: the announce is over.
    pub fn announce_done(&self) {
        self.announce.store(false, Ordering::Relaxed);
    }

    /// Sends CONFIG_CHANGE_MSG: a 12-byte header, no body, no reply asked. The relay gave
    /// the channel a write timeout (relay.rs, CHANNEL_WRITE).
    fn changed(&self) -> Result<(), ConfigChangeError> {
        let mut guard = crate::sync::lock(&self.channel);
        let channel = guard.as_mut().ok_or(ConfigChangeError::NoChannel)?;
        let mut hdr = [0u8; 12];
        hdr[..4].copy_from_slice(&(BackendReq::CONFIG_CHANGE_MSG as u32).to_le_bytes());
        // Flags: version 1 (vhost-user spec, "Header"); size: no body.
        hdr[4..8].copy_from_slice(&1u32.to_le_bytes());
        channel.write_all(&hdr).map_err(ConfigChangeError::Write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_change_is_one_header_on_the_channel() {
        let s = LiveStatus::default();
        assert!(s.link_up() && !s.announcing());
        assert!(matches!(s.set_link(false), Err(ConfigChangeError::NoChannel)));
        assert!(!s.link_up(), "kept for the next driver");
        let (mut frontend, port) = UnixStream::pair().unwrap();
        s.set_channel(Some(port));
        s.set_link(true).unwrap();
        let mut hdr = [0u8; 12];
        frontend.read_exact(&mut hdr).unwrap();
        assert_eq!(hdr, [2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(s.announce(false), Err(ConfigChangeError::NoAnnounce)));
        s.announce(true).unwrap();
        assert!(s.announcing());
        frontend.read_exact(&mut hdr).unwrap();
        s.announce_done();
        assert!(!s.announcing());
        drop(frontend);
        assert!(matches!(s.set_link(false), Err(ConfigChangeError::Write(_))));
    }
}

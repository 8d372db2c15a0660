//! I/O ports: vhost-user guests and host tap devices. The only layer that touches file
//! descriptors and vrings; `vhost_user` is the only module that imports vhost-user-backend.

pub mod arena;
pub mod poll;
pub mod tap;
pub mod vhost_user;

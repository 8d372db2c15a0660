//! The DPAA (FMan) MAC receive filter: hash functions, the register file the data path reads,
//! the model that keeps it in sync with the guest's address lists, and the VLAN table beside
//! it.

pub mod hash;
pub mod layout;
pub mod model;
pub mod regs;
pub mod vlan;

pub use layout::{Layout, LayoutError};
pub use model::{Filter, SyncReport};
pub use regs::{FilterRegs, Verdict};
pub use vlan::{VlanTable, VLAN_IDS};

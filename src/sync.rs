//! Locking that outlives a panicking thread.
//!
//! Every mutex in the daemon guards data whose invariants hold between statements
//! (counters, tables replaced whole, writer tokens, registries), so a guard dropped by a
//! panic leaves nothing half-written that a later holder could trip over. A poisoned lock
//! is therefore taken as it is: one thread's panic (already logged and counted) must not
//! take every other port down with it at its next `lock()`.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poison (see the module comment for why that is sound here).
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken_with_its_data() {
        let m = std::sync::Arc::new(Mutex::new(7));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            *g = 8;
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 8);
    }
}

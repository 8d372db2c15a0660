//! A worker's buffer that frames are read into back to back, each handed out as a borrow
//! of its own.

/// The part of a worker's buffer not yet handed out. Frames are read into [`Arena::room`]
/// and split off with [`Arena::take`]; each lives as long as the arena's borrow of the
/// buffer, so a frame lent to an outbox (pipeline/outbox.rs) stays put until the outbox is
/// gone, and the borrow checker forbids reading new frames over it meanwhile.
pub struct Arena<'a> {
    rest: &'a mut [u8],
}

impl<'a> Arena<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Arena { rest: buf }
    }

    /// The room left, to read the next frames into.
    pub fn room(&mut self) -> &mut [u8] {
        self.rest
    }

    /// Bytes left.
    pub fn len(&self) -> usize {
        self.rest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The first `len` bytes of the room, as a frame of their own; the room then starts
    /// after them. `None` if the room is shorter.
    pub fn take(&mut self, len: usize) -> Option<&'a mut [u8]> {
        if len > self.rest.len() {
            return None;
        }
        let (frame, rest) = std::mem::take(&mut self.rest).split_at_mut(len);
        self.rest = rest;
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::Arena;

    #[test]
    fn frames_are_disjoint_and_in_order() {
        let mut buf: Vec<u8> = (0..10).collect();
        let mut arena = Arena::new(&mut buf);
        arena.room()[..3].copy_from_slice(&[7, 7, 7]);
        let a = arena.take(3).unwrap();
        let b = arena.take(4).unwrap();
        assert!(arena.take(4).is_none(), "past the end");
        assert_eq!(arena.len(), 3);
        b[0] = 9;
        assert_eq!((&a[..], &b[..]), (&[7, 7, 7][..], &[9, 4, 5, 6][..]));
        assert_eq!(arena.room(), &[7, 8, 9]);
    }
}

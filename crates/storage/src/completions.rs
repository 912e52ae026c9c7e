//! A fixed-capacity FIFO of finished requests, allocated once, so completing a request on the
//! hot path never allocates.

use crate::Completion;

pub(crate) struct CompletionRing {
    entries: Box<[Completion]>,
    head: usize,
    len: usize,
}

impl CompletionRing {
    pub(crate) fn new(capacity: usize) -> CompletionRing {
        let idle = Completion { tag: 0, result: Ok(0) };
        CompletionRing { entries: vec![idle; capacity].into_boxed_slice(), head: 0, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len == self.entries.len()
    }

    /// Queue `completion`; `false` (dropping nothing already queued) when full.
    pub(crate) fn push(&mut self, completion: Completion) -> bool {
        if self.is_full() {
            return false;
        }
        let at = (self.head + self.len) % self.entries.len();
        self.entries[at] = completion;
        self.len += 1;
        true
    }

    /// Hand every queued completion to `done`, oldest first; returns how many.
    pub(crate) fn drain(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let count = self.len;
        while self.len > 0 {
            let completion = self.entries[self.head];
            self.head = (self.head + 1) % self.entries.len();
            self.len -= 1;
            done(completion);
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_wraps_around_and_refuses_when_full() {
        let mut ring = CompletionRing::new(3);
        let mut seen = Vec::new();
        for round in 0..4u32 {
            for i in 0..3 {
                assert!(ring.push(Completion { tag: round * 10 + i, result: Ok(i) }));
            }
            assert!(ring.is_full() && !ring.push(Completion { tag: 99, result: Ok(0) }));
            assert_eq!(ring.drain(&mut |c| seen.push(c.tag)), 3);
            assert_eq!(ring.len(), 0);
        }
        let expected: Vec<u32> = (0..4).flat_map(|r| (0..3).map(move |i| r * 10 + i)).collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn zero_capacity_is_always_full() {
        let mut ring = CompletionRing::new(0);
        assert!(!ring.push(Completion { tag: 1, result: Ok(0) }));
        assert_eq!(ring.drain(&mut |_| panic!("nothing queued")), 0);
    }
}

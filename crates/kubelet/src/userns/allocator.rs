//! A fixed-size bitmap of user namespace blocks (upstream's allocation bitmap): each bit
//! is one block of ids a pod may own. Pure logic, no ids and no files.

/// Which of `len` blocks are taken.
#[derive(Clone, Debug)]
pub struct Allocator {
    words: Vec<u64>,
    len: usize,
    used: usize,
}

impl Allocator {
    pub fn new(len: usize) -> Allocator {
        Allocator {
            words: vec![0; len.div_ceil(64)],
            len,
            used: 0,
        }
    }

    /// How many blocks the bitmap holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many blocks are taken.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Whether block `i` is taken; blocks outside the bitmap count as taken, so nobody
    /// is ever handed one.
    pub fn has(&self, i: usize) -> bool {
        if i >= self.len {
            return true;
        }
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Takes block `i`; false when it is outside the bitmap or already taken.
    pub fn allocate(&mut self, i: usize) -> bool {
        if self.has(i) {
            return false;
        }
        self.words[i / 64] |= 1 << (i % 64);
        self.used += 1;
        true
    }

    /// Takes the lowest free block, if any. Lowest-first keeps a node's allocations
    /// predictable in logs and tests; nothing depends on the order.
    pub fn allocate_next(&mut self) -> Option<usize> {
        let (w, word) = self
            .words
            .iter()
            .enumerate()
            .find(|(_, word)| **word != u64::MAX)?;
        let i = w * 64 + word.trailing_ones() as usize;
        self.allocate(i).then_some(i)
    }

    /// Frees block `i`; freeing a free or out-of-range block is a no-op.
    pub fn release(&mut self, i: usize) {
        if i < self.len && self.has(i) {
            self.words[i / 64] &= !(1 << (i % 64));
            self.used -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_the_lowest_free_block_until_full() {
        let mut a = Allocator::new(3);
        assert_eq!(a.allocate_next(), Some(0));
        assert_eq!(a.allocate_next(), Some(1));
        assert_eq!(a.allocate_next(), Some(2));
        assert_eq!(a.allocate_next(), None, "three blocks, three taken");
        assert_eq!(a.used(), 3);
        a.release(1);
        assert_eq!(a.allocate_next(), Some(1), "a freed block is reused");
    }

    #[test]
    fn explicit_allocation_refuses_taken_and_out_of_range_blocks() {
        let mut a = Allocator::new(70);
        assert!(a.allocate(65));
        assert!(!a.allocate(65), "already taken");
        assert!(!a.allocate(70), "outside the bitmap");
        assert!(a.has(70), "outside counts as taken");
        for _ in 0..65 {
            assert!(a.allocate_next().is_some());
        }
        // 0..=65 are taken; the scan crosses the word boundary and skips 65.
        assert_eq!(a.allocate_next(), Some(66));
        a.release(65);
        a.release(65);
        a.release(1000);
        assert_eq!(a.used(), 66);
        assert!(!a.has(65));
    }

    #[test]
    fn an_empty_bitmap_has_nothing_to_give() {
        let mut a = Allocator::new(0);
        assert!(a.is_empty());
        assert_eq!(a.allocate_next(), None);
    }

    #[test]
    fn a_full_word_is_skipped() {
        let mut a = Allocator::new(128);
        for i in 0..64 {
            assert!(a.allocate(i));
        }
        assert_eq!(a.allocate_next(), Some(64));
    }
}

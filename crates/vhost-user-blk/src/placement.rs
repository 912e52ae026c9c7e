//! Which IOCore serves a disk's queues: each disk, in the order given, goes to the IOCore that
//! has the fewest queues so far (the first of those on a tie), and all of a disk's queues stay
//! on that IOCore, where they share its rate limiter. With disks of equal queue counts, disk `i`
//! lands on IOCore `i mod N`.

/// Queue counts per IOCore.
pub struct Placement {
    queues: Vec<usize>,
}

impl Placement {
    pub fn new(iocores: usize) -> Placement {
        Placement { queues: vec![0; iocores.max(1)] }
    }

    /// The IOCore for a disk of `queues` queues, counted in.
    pub fn place(&mut self, queues: usize) -> usize {
        let (index, _) =
            self.queues.iter().enumerate().min_by_key(|&(i, &load)| (load, i)).unwrap_or((0, &0));
        self.queues[index] += queues;
        index
    }

    /// A disk of `queues` queues on IOCore `iocore` is gone.
    pub fn remove(&mut self, iocore: usize, queues: usize) {
        if let Some(load) = self.queues.get_mut(iocore) {
            *load = load.saturating_sub(queues);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_disk_goes_to_the_least_loaded_iocore() {
        let mut p = Placement::new(2);
        assert_eq!([1, 1, 1, 1].map(|q| p.place(q)), [0, 1, 0, 1]);
        let mut p = Placement::new(2);
        assert_eq!([4, 1, 1, 1, 1].map(|q| p.place(q)), [0, 1, 1, 1, 1]);
        assert_eq!(p.place(1), 0, "4 against 4: the first");
        let mut p = Placement::new(1);
        assert_eq!([2, 3].map(|q| p.place(q)), [0, 0]);
        let mut p = Placement::new(2);
        assert_eq!([1, 1].map(|q| p.place(q)), [0, 1]);
        p.remove(0, 1);
        assert_eq!(p.place(1), 0, "a removed disk's IOCore is the least loaded again");
    }
}

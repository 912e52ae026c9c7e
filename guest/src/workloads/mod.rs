pub mod blk;
pub mod blk_hostile;
pub mod blkdev;
pub mod exitcost;
pub mod faults;
pub mod hello;
pub mod pipeline;

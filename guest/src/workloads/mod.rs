pub mod exitcost;
pub mod faults;
pub mod hello;

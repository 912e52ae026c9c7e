//! COM1 output. The probe writes bytes straight to the transmit register: the UART is virtual,
//! so waiting for "transmitter empty" would only add one exit per byte.

use core::fmt;

const COM1: u16 = 0x3f8;

pub struct Com1;

impl fmt::Write for Com1 {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for byte in s.bytes() {
            crate::x86::outb(COM1, byte);
        }
        Ok(())
    }
}

#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        let _ = core::fmt::Write::write_fmt(&mut $crate::serial::Com1, format_args!($($arg)*));
    }};
}

#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {{
        $crate::print!($($arg)*);
        $crate::print!("\n");
    }};
}

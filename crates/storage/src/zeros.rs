//! Zeroing memory a backend does not own a Rust reference to (a mapping host tools share, a
//! guest's buffer): volatile stores from a static page of zeros, no allocation or system call.

use vm_memory::VolatileSlice;

/// Store zeros over every byte of `dst`, a page at a time.
pub(crate) fn fill(dst: &VolatileSlice) {
    static ZEROS: [u8; 4096] = [0; 4096];
    let mut at = 0;
    while at < dst.len() {
        let n = (dst.len() - at).min(ZEROS.len());
        // `at + n <= dst.len()`: never an error.
        if let Ok(part) = dst.subslice(at, n) {
            part.copy_from(&ZEROS[..n]);
        }
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroes_every_byte_across_pages_and_no_more() {
        let mut buf = vec![0xffu8; 3 * 4096 + 100];
        // SAFETY: `buf` outlives the slice and nothing else touches it meanwhile.
        let slice = unsafe { VolatileSlice::new(buf.as_mut_ptr().add(1), buf.len() - 2) };
        fill(&slice);
        assert_eq!((buf[0], buf[buf.len() - 1]), (0xff, 0xff));
        assert!(buf[1..buf.len() - 1].iter().all(|&x| x == 0));
    }
}

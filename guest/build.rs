fn main() {
    println!("cargo:rerun-if-changed=link.ld");
}

//! Links the `nodus` binary as a non-PIE executable.
//!
//! Every running container keeps one shim process, started from this same binary. In a PIE
//! the dynamic loader must relocate every pointer in `.data.rel.ro` (vtables, string tables,
//! the tables of a 100+ MB program) at each start, which makes those pages private and dirty
//! in every shim: about 570 KiB per container measured. Linked at a fixed address they stay
//! clean, file-backed pages shared by all shims and the daemon. runc, containerd and
//! containerd-shim-runc-v2 (Go's default) ship as non-PIE executables too; shared libraries,
//! stack, heap and mmap regions stay randomized.
fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
}

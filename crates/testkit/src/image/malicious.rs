//! Images whose single layer tries to write outside the unpack root, for the unpacker's
//! rejection tests. Entries are written in the order listed (no sorting).
//!
//! A safe unpacker either rejects the layer or keeps every write inside the root; either way
//! nothing may appear outside it. Each variant's doc says what to check.

use std::path::Path;

use super::layer::{Entry, LayerBuilder};
use super::manifest::{Image, ImageBuilder};

/// Which escape a [`malicious_layer_image`] attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malice {
    /// File `../escape` (`"pwned\n"`): lands in the unpack root's *parent* if not stopped.
    DotDotPath,
    /// File at the absolute path `<outside>/pwned`: must not be created on the host (a safe
    /// unpacker rejects it or writes `<root>/<outside>/pwned`).
    AbsolutePath,
    /// Symlink `evil -> <outside>` (absolute), then file `evil/pwned`.
    SymlinkEscape,
    /// Symlinks `chain1 -> chain2` and `chain2 -> <outside>` (absolute), then file
    /// `chain1/pwned`.
    SymlinkChainEscape,
    /// Symlink `up -> ../../../../../../../../../..<outside>` (relative, climbing past `/`),
    /// then file `up/pwned`.
    RelativeSymlinkEscape,
    /// Hard link `victim -> <outside>/victim` (absolute target outside the layer), then a
    /// regular file `victim` (`"pwned\n"`) written over it. The test should create
    /// `<outside>/victim` first and check that its content is unchanged.
    HardlinkEscape,
}

/// The file name every variant tries to create outside the root.
pub const PWNED: &str = "pwned";

/// A one-layer OCI image attempting `kind`, aimed at the host directory `outside` (an
/// absolute path the test owns, e.g. a temp dir; it must stay empty / unchanged).
pub fn malicious_layer_image(kind: Malice, outside: &Path) -> Image {
    let out = outside
        .to_str()
        .expect("utf-8 path")
        .trim_end_matches('/')
        .to_string();
    assert!(out.starts_with('/'), "outside must be absolute");
    let pwned = "pwned\n";
    let layer = LayerBuilder::new()
        .preserve_order()
        .comment(format!("testkit: {kind:?}"));
    let layer = match kind {
        Malice::DotDotPath => layer.file("../escape", pwned),
        Malice::AbsolutePath => layer.file(format!("{out}/{PWNED}"), pwned),
        Malice::SymlinkEscape => layer
            .symlink("evil", out)
            .file(format!("evil/{PWNED}"), pwned),
        Malice::SymlinkChainEscape => layer
            .symlink("chain1", "chain2")
            .symlink("chain2", out)
            .file(format!("chain1/{PWNED}"), pwned),
        Malice::RelativeSymlinkEscape => layer
            .symlink("up", format!("../../../../../../../../../..{out}"))
            .file(format!("up/{PWNED}"), pwned),
        Malice::HardlinkEscape => layer
            .entry(Entry::hardlink("victim", format!("{out}/victim")))
            .file("victim", pwned),
    };
    ImageBuilder::new()
        .layer(layer)
        .cmd(["/bin/sh"])
        .build()
        .expect("build malicious image")
}

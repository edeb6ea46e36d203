//! A ~100 MB image of mixed content, generated deterministically from a fixed seed.
//!
//! Five gzip layers (uncompressed sizes approximate):
//!
//! 1. `data/random-{0,1,2}.bin`: 3 × 10 MiB of pseudo-random (incompressible) bytes.
//! 2. `text/log-{0..3}.txt`: 4 × 6 MiB of compressible text (words from a small list).
//! 3. `small/dNN/fNNNN`: 3000 files of 512 B – 8 KiB in 30 dirs, alternately text and random.
//! 4. `mixed/blob-NN.bin`: 10 × 2 MiB, first half random, second half text.
//! 5. `more/random.bin` (8 MiB), `more/words.txt` (5 MiB), `more/tiny/tNNNN`: 1000 files of
//!    16–255 bytes.
//!
//! About 100 MiB uncompressed and 65 MiB compressed (gzip level 1, to keep the build to a
//! few seconds in an unoptimized test build; layers are compressed in parallel). Build it
//! once per test binary (e.g. in a `std::sync::OnceLock`) when several tests need it.

use super::busybox::PATH;
use super::layer::{Entry, LayerBuilder};
use super::manifest::{Image, ImageBuilder};

/// Seed of the generator behind [`large_image`].
pub const SEED: u64 = 0x6e6f_6475_735f_6c67;

const MIB: usize = 1024 * 1024;

/// A small, fast, deterministic PRNG (SplitMix64), stable across Rust and crate versions.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo) as u64) as usize
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// `len` bytes of compressible text: random words and line numbers.
    pub fn text(&mut self, len: usize) -> Vec<u8> {
        const WORDS: &[&str] = &[
            "kubelet",
            "pod",
            "sandbox",
            "container",
            "image",
            "layer",
            "snapshot",
            "cgroup",
            "namespace",
            "lease",
            "node",
            "probe",
            "eviction",
            "volume",
            "mount",
            "overlay",
            "digest",
            "manifest",
            "registry",
            "mirror",
            "pull",
            "unpack",
            "whiteout",
            "runc",
        ];
        let mut out = Vec::with_capacity(len + 128);
        let mut line = 0u64;
        while out.len() < len {
            line += 1;
            out.extend_from_slice(format!("{line:08} ").as_bytes());
            let r = self.next_u64();
            for i in 0..8 {
                out.extend_from_slice(
                    WORDS[((r >> (i * 8)) & 0xff) as usize % WORDS.len()].as_bytes(),
                );
                out.push(if i == 7 { b'\n' } else { b' ' });
            }
        }
        out.truncate(len);
        out
    }
}

/// The large image as a builder.
pub fn large_image_builder() -> ImageBuilder {
    let mut rng = SplitMix64::new(SEED);

    let mut l1 = LayerBuilder::new()
        .comment("testkit: random data")
        .dir("data");
    for i in 0..3 {
        l1.push(Entry::file(
            format!("data/random-{i}.bin"),
            rng.bytes(10 * MIB),
        ));
    }

    let mut l2 = LayerBuilder::new().comment("testkit: text").dir("text");
    for i in 0..4 {
        l2.push(Entry::file(format!("text/log-{i}.txt"), rng.text(6 * MIB)));
    }

    let mut l3 = LayerBuilder::new()
        .comment("testkit: small files")
        .dir("small");
    for d in 0..30 {
        l3.push(Entry::dir(format!("small/d{d:02}")));
    }
    for f in 0..3000 {
        let len = rng.range(512, 8193);
        let data = if f % 2 == 0 {
            rng.text(len)
        } else {
            rng.bytes(len)
        };
        l3.push(Entry::file(format!("small/d{:02}/f{f:04}", f % 30), data));
    }

    let mut l4 = LayerBuilder::new()
        .comment("testkit: mixed blobs")
        .dir("mixed");
    for i in 0..10 {
        let mut data = rng.bytes(MIB);
        data.extend(rng.text(MIB));
        l4.push(Entry::file(format!("mixed/blob-{i:02}.bin"), data));
    }

    let mut l5 = LayerBuilder::new()
        .comment("testkit: more")
        .dir("more")
        .dir("more/tiny");
    l5.push(Entry::file("more/random.bin", rng.bytes(8 * MIB)));
    l5.push(Entry::file("more/words.txt", rng.text(5 * MIB)));
    for i in 0..1000 {
        let len = rng.range(16, 256);
        l5.push(Entry::file(format!("more/tiny/t{i:04}"), rng.text(len)));
    }

    let fast = |l: LayerBuilder| l.compression_level(1);
    ImageBuilder::new()
        .layer(fast(l1))
        .layer(fast(l2))
        .layer(fast(l3))
        .layer(fast(l4))
        .layer(fast(l5))
        .env(PATH)
        .cmd(["sh"])
}

/// The large image (OCI manifest, 5 gzip layers, ~100 MiB uncompressed).
pub fn large_image() -> Image {
    large_image_builder().build().expect("build large image")
}

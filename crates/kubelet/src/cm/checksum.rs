//! The checksum of the kubelet's checkpoint files (upstream's
//! pkg/kubelet/checkpointmanager/checksum): FNV-1a 32 over the checkpointed data. Upstream
//! hashes a Go-specific dump of the struct; nodus hashes its JSON, so a checkpoint written by
//! one kubelet is not verified by the other, and within nodus it catches a torn or edited file.
//! One copy for the device, CPU and memory managers.

/// FNV-1a 32, widened to the u64 upstream stores.
pub fn fnv32a(bytes: &[u8]) -> u64 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    u64::from(h)
}

/// The checksum of `data`'s JSON.
pub fn of_json<T: serde::Serialize>(data: &T) -> Result<u64, serde_json::Error> {
    Ok(fnv32a(&serde_json::to_vec(data)?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn fnv1a_32_reference_values() {
        assert_eq!(super::fnv32a(b""), 0x811c_9dc5);
        assert_eq!(super::fnv32a(b"a"), 0xe40c_292c);
    }
}

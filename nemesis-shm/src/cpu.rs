//! What the CPU is, for the defaults that measurements found to differ between CPU
//! makers (the large-message strategies, a receiver's read-ahead).

use std::sync::OnceLock;

/// The CPU's vendor string (`GenuineIntel`, `AuthenticAMD`), or zeros where there is no
/// CPUID. Asked once: CPUID traps to the hypervisor in a guest.
pub fn vendor() -> [u8; 12] {
    static VENDOR: OnceLock<[u8; 12]> = OnceLock::new();
    *VENDOR.get_or_init(ask_vendor)
}

/// Whether the CPU is an Intel one.
pub fn is_intel() -> bool {
    &vendor() == b"GenuineIntel"
}

fn ask_vendor() -> [u8; 12] {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unused_unsafe)]
        // SAFETY: CPUID leaf 0 exists on every x86_64 CPU and has no side effects.
        let r = unsafe { core::arch::x86_64::__cpuid(0) };
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        [0; 12]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vendor_is_printable_where_there_is_cpuid() {
        let v = vendor();
        if cfg!(target_arch = "x86_64") {
            assert!(v.iter().all(|b| b.is_ascii_graphic()), "{v:?}");
        } else {
            assert_eq!(v, [0; 12]);
        }
        assert_eq!(is_intel(), &v == b"GenuineIntel");
    }
}

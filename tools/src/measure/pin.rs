//! Pinning processes to CPUs, so the two sides of a measurement stay on separate cores.

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is empty and valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid out-pointer of the size given.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET only reads the set.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Restricts the calling thread (and its future children) to `cpu`.
pub fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is empty and valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit of `set`; `cpu` below CPU_SETSIZE is checked by it.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Lets the calling thread (and its future children) run on every CPU of `cpus`: gives
/// back what a [`pin_to`] took, so that processes started next are not pinned with it.
pub fn set_cpus(cpus: &[usize]) {
    // SAFETY: an all-zero cpu_set_t is empty and valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET writes one bit of `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

/// Two distinct CPUs for a pair of processes, when there are two.
pub fn pair_cpus() -> Option<(usize, usize)> {
    match allowed_cpus()[..] {
        [a, b, ..] => Some((a, b)),
        _ => None,
    }
}

//! The supervisor's own heap: keeping glibc malloc from holding on to what
//! it has freed.
//!
//! glibc gives each thread that meets a locked arena a new one (up to 8 per
//! core), and keeps what is freed in each for reuse rather than returning
//! it to the system; a long-lived server whose tokio workers take turns
//! with cells' buffers and results therefore keeps its peak. Capping the
//! arenas bounds how many heaps hold free memory, and [`release_free_memory`]
//! hands what is free in them back once the server is idle.
//! Elsewhere (another allocator, another libc) both do nothing.

/// Let malloc use at most `max` arenas. Best called early: arenas made
/// before it stay. Whether the setting was taken.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn cap_arenas(max: u8) -> bool {
    // SAFETY: mallopt takes two integers by value and only changes malloc's
    // tuning; M_ARENA_MAX is a documented parameter and any positive count
    // is valid. It is thread-safe (glibc takes its own lock).
    unsafe { libc::mallopt(libc::M_ARENA_MAX, libc::c_int::from(max.max(1))) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn cap_arenas(_max: u8) -> bool {
    false
}

/// Return the free memory of every malloc arena to the system (the top of
/// each heap is shrunk and whole free pages inside it are released).
/// Whether any memory was released.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() -> bool {
    // SAFETY: malloc_trim takes a size by value, touches only malloc's own
    // state under its arena locks, and is safe to call from any thread at
    // any time; memory in use is never released.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() -> bool {
    false
}

//! The macOS backend: a profile compiled into an SBPL policy, and the
//! worker started under `sandbox-exec` with it.
//!
//! Both halves are plain, portable Rust, so they are built and tested on
//! every platform: [`sbpl`] turns a [`crate::sandbox::SandboxPlan`] into
//! the policy text (the built-in profiles' policies are kept in
//! `sandbox-profiles/macos/` and compared with the compiler's output by a
//! test), and [`launch`] builds the `sandbox-exec -p <policy> <engine>
//! __seatbelt_worker` command with `std::process` alone. On Linux a test
//! points the launcher at a stand-in script that records its arguments and
//! runs the worker without a sandbox, so the whole cell round trip through
//! this path runs here; only the kernel's enforcement of the policy needs a
//! Mac (`cellbox security-test` there is the check).
//!
//! What the worker does itself once started this way (close inherited
//! descriptors, fix the environment, set its rlimits) lives with the other
//! layers in `crate::sandbox::seatbelt`.

pub mod doctor;
pub mod launch;
pub mod sbpl;

//! Host tools offered to cells as capabilities and by `serve` as MCP tools
//! of their own: the file tools ([`crate::files`]) and `aggregate_context`
//! ([`crate::context`]).

#[cfg(target_os = "linux")]
pub mod config;
pub mod declared;
pub mod env;
mod stdio_tap;
pub mod upstream;
pub(crate) mod upstream_http;

pub use config::{ToolDecl, ToolsConfig};
pub use declared::SupervisorSlot;

use crate::supervisor::{Capability, CapabilityError};
use std::sync::Arc;

/// The tools `serve` also offers directly (without a cell) when configured.
pub const DIRECT: &[&str] = &[
    "read_file",
    "list_dir",
    "search_files",
    "write_file",
    "edit_file",
    "aggregate_context",
];

/// Host tools could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    #[error("[files]: {0}")]
    Files(#[from] crate::files::FileError),
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    #[error(transparent)]
    Declared(#[from] declared::DeclaredError),
}

/// Every host capability the configuration declares: the file tools when
/// `[files]` names a root or a workspace, and `aggregate_context`.
pub fn host_capabilities(files: &crate::files::FilesConfig) -> Result<Vec<Capability>, ToolsError> {
    host_and_declared(files, &ToolsConfig::new(), &SupervisorSlot::default())
}

/// [`host_capabilities`] and the declared tools of `tools`; the command
/// tools find their supervisor in `slot`, to be set once it is built.
pub fn host_and_declared(
    files: &crate::files::FilesConfig,
    tools: &ToolsConfig,
    slot: &SupervisorSlot,
) -> Result<Vec<Capability>, ToolsError> {
    let mut caps = declared::capabilities(tools, slot)?;
    if !files.is_empty() {
        let f = Arc::new(crate::files::Files::open(files)?);
        caps.extend(crate::files::capabilities(f)?);
    }
    caps.push(crate::context::capability()?);
    Ok(caps)
}

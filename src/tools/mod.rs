//! Host tools offered to cells as capabilities and by `serve` as MCP tools
//! of their own: the file tools ([`crate::files`]) and `aggregate_context`
//! ([`crate::context`]).

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
}

/// Every host capability the configuration declares: the file tools when
/// `[files]` names a root or a workspace, and `aggregate_context`.
pub fn host_capabilities(files: &crate::files::FilesConfig) -> Result<Vec<Capability>, ToolsError> {
    let mut caps = Vec::new();
    if !files.is_empty() {
        let f = Arc::new(crate::files::Files::open(files)?);
        caps.extend(crate::files::capabilities(f)?);
    }
    caps.push(crate::context::capability()?);
    Ok(caps)
}

mod cli;
pub mod common;
mod mcp;
mod rhai;

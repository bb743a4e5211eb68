mod cli;
pub mod common;
mod isolation;
mod mcp;
mod python;
mod rhai;
mod zygote;

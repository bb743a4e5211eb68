mod cli;
pub mod common;
mod rhai;

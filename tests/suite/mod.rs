mod cli;
pub mod common;
mod isolation;
mod rhai;

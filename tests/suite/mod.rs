mod cli;
pub mod common;
mod python;
mod rhai;

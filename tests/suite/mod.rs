mod cli;
mod clients;
pub mod common;
mod faults;
mod isolation;
mod mcp;
mod python;
mod rhai;
mod zygote;

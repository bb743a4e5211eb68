mod cli;
pub mod common;
mod isolation;
mod python;
mod rhai;
mod zygote;

//! Models: OpenAI-compatible chat-completions endpoints the supervisor
//! calls on a cell's behalf (`model_query`), with the key kept out of every
//! cell, result, event and message.

#[doc(hidden)]
pub mod client;
pub mod config;

pub use client::{ClientError, ModelClient, ModelError, ModelReply, Query, TokenUsage};
pub use config::{ModelConfig, ModelsConfigError, ModelsSection};

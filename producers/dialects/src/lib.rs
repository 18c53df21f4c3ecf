//! forgelog-dialects: the capture proxy's translation core, with no I/O.
//!
//! - [`canonical`]: one chat model every dialect maps to and from;
//! - [`dialect`]: the adapters (OpenAI Chat, OpenAI Responses, Anthropic
//!   Messages, Gemini): requests in, responses and SSE streams out, errors in
//!   each dialect's own shape;
//! - [`hermes`]: tool calls written as `<tool_call>` text, parsed out of a
//!   completion and rendered into a prompt (the proxy, the engine and the chat
//!   template share it);
//! - [`hf`]: OpenAI Chat messages in the shape Hugging Face chat templates read;
//! - [`splice`]: a follow-up call's prompt ids as the earlier call's prompt and
//!   sampled ids plus the template's tokens for the new messages (token in, token out).

pub mod canonical;
pub mod dialect;
pub mod hermes;
pub mod hf;
pub mod splice;

//! The agent's side of the wire. The conversation is kept in the proxy's
//! canonical model and written and read with the proxy's own dialect adapters
//! (their client direction, `encode_request` / `decode_response`): the demo
//! has no translation code of its own.

use forgelog_dialects::canonical::{ChatRequest, ChatResponse};
use forgelog_dialects::dialect::{
    AnthropicDialect, DialectAdapter, DialectError, OpenAiChatDialect,
};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentDialect {
    OpenAiChat,
    Anthropic,
}

impl AgentDialect {
    pub const ALL: [AgentDialect; 2] = [AgentDialect::OpenAiChat, AgentDialect::Anthropic];

    /// The harness name the rollouts are recorded under.
    pub fn harness(self) -> &'static str {
        match self {
            AgentDialect::OpenAiChat => "demo-openai-chat",
            AgentDialect::Anthropic => "demo-anthropic",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            AgentDialect::OpenAiChat => "/v1/chat/completions",
            AgentDialect::Anthropic => "/v1/messages",
        }
    }

    /// The request body for `req`, in this dialect.
    pub fn encode(self, req: &ChatRequest) -> Value {
        match self {
            AgentDialect::OpenAiChat => OpenAiChatDialect::encode_request(req),
            AgentDialect::Anthropic => AnthropicDialect::encode_request(req),
        }
    }

    /// The assistant's answer in a response body of this dialect.
    pub fn decode(self, body: &Value) -> Result<ChatResponse, DialectError> {
        match self {
            AgentDialect::OpenAiChat => OpenAiChatDialect::decode_response(body),
            AgentDialect::Anthropic => AnthropicDialect::decode_response(body),
        }
    }
}

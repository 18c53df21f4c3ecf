//! The one request/response model every dialect translates to and from.
//! Pure data: no I/O, no dialect specifics.

use forgelog_schemas::SamplingParams;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// Tool results; their parts are [`Part::ToolResult`].
    Tool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

impl Message {
    pub fn text(role: Role, text: impl Into<String>) -> Message {
        Message {
            role,
            parts: vec![Part::Text(text.into())],
        }
    }

    /// The text parts, concatenated.
    pub fn joined_text(&self) -> String {
        text_of(&self.parts)
    }
}

/// The text parts of `parts`, concatenated.
fn text_of(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// An image, carried opaquely: the proxy never decodes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Image {
    Base64 { media_type: String, data: String },
    Url(String),
}

impl Image {
    /// As a URL (`data:` for inline images), the form OpenAI-style APIs take.
    pub fn to_url(&self) -> String {
        match self {
            Image::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
            Image::Url(u) => u.clone(),
        }
    }

    pub fn from_url(url: &str) -> Image {
        if let Some(rest) = url.strip_prefix("data:") {
            if let Some((media_type, data)) = rest.split_once(";base64,") {
                return Image::Base64 {
                    media_type: media_type.to_string(),
                    data: data.to_string(),
                };
            }
        }
        Image::Url(url.to_string())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text, exactly as the model wrote them.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Image(Image),
    ToolCall(ToolCall),
    ToolResult {
        call_id: String,
        /// The tool's name, where the dialect carries it (Gemini needs it).
        name: Option<String>,
        content: String,
        is_error: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// JSON schema of the arguments.
    pub parameters: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub tool_choice: Option<ToolChoice>,
    pub sampling: SamplingParams,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub stream_usage: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    StopSequence,
    ContentFilter,
}

impl FinishReason {
    /// From an OpenAI/vLLM `finish_reason`.
    pub fn from_openai(s: &str) -> FinishReason {
        match s {
            "length" => FinishReason::Length,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            _ => FinishReason::Stop,
        }
    }

    pub fn openai(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::StopSequence => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenUsage {
    pub input: u64,
    pub output: u64,
}

/// The assistant's answer: text and tool calls, in the order the model produced them.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// Deterministic per call; dialects prefix it (`chatcmpl-`, `resp_`, `msg_`).
    pub id: String,
    pub model: String,
    pub created: i64,
    /// Only [`Part::Text`] and [`Part::ToolCall`].
    pub parts: Vec<Part>,
    pub finish: FinishReason,
    pub usage: TokenUsage,
}

impl ChatResponse {
    pub fn text(&self) -> String {
        text_of(&self.parts)
    }

    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.parts.iter().filter_map(|p| match p {
            Part::ToolCall(c) => Some(c),
            _ => None,
        })
    }
}

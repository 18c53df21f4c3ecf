//! The model's chat template (Jinja, as in Hugging Face `tokenizer_config.json`
//! or GGUF `tokenizer.chat_template`), rendered with minijinja.

use crate::segment_cache::SegmentCache;
use forgelog_dialects::hf;
use forgelog_dialects::splice::ChatRenderer;
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind};
use serde_json::Value;
use std::borrow::Cow;
use std::sync::Arc;
use tokenizers::Tokenizer;

/// ChatML, for models that ship no template.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[derive(Debug, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(String);

#[derive(Clone)]
pub struct ChatTemplate {
    source: String,
    /// Compiled once: the proxy renders every call's conversation (three
    /// times to splice it), and compiling per render was most of that.
    compiled: Arc<Result<Environment<'static>, String>>,
    bos_token: String,
    eos_token: String,
    /// Whether the template shows assistant `tool_calls` itself. When it does
    /// not (SmolLM2, plain ChatML), they are written into the content as Hermes
    /// `<tool_call>` text, the form the proxy parses from the model's output:
    /// otherwise the model's own calls would vanish from the next prompt.
    renders_tool_calls: bool,
}

impl ChatTemplate {
    pub fn new(source: impl Into<String>, bos_token: &str, eos_token: &str) -> ChatTemplate {
        let source = source.into();
        ChatTemplate {
            renders_tool_calls: source.contains("tool_calls"),
            compiled: Arc::new(compile(&source)),
            source,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        }
    }

    /// The Jinja source, as a `tokenizer_config.json` carries it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The `bos_token` the template sees (empty when the model has none).
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The `eos_token` the template sees.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders OpenAI-style `messages` (and `tools`, which the template may
    /// show the model) into the prompt text.
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let env = self
            .compiled
            .as_ref()
            .as_ref()
            .map_err(|e| TemplateError(e.clone()))?;
        let template = env
            .get_template(NAME)
            .map_err(|e| TemplateError(e.to_string()))?;
        let messages: Vec<Cow<'_, Value>> = messages
            .iter()
            .map(|m| normalize_message(m, self.renders_tool_calls))
            .collect();
        let tools = tools.filter(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty()));
        template
            .render(minijinja::context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| TemplateError(format!("{e:#}")))
    }
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

/// The template's name in its environment.
const NAME: &str = "chat";

/// The environment `source` renders in, as Hugging Face sets it up.
fn compile(source: &str) -> Result<Environment<'static>, String> {
    let mut env = Environment::new();
    // Hugging Face renders with these Jinja options.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_filter("tojson", tojson);
    env.add_template_owned(NAME, source.to_string())
        .map_err(|e| e.to_string())?;
    Ok(env)
}

/// Hugging Face's `tojson` filter ([`hf::tojson`]). minijinja's own is
/// compact and escapes `<`, `>`, `&` and `'`: a Qwen template's tool list
/// rendered otherwise than the model was trained on.
fn tojson(value: minijinja::Value, kwargs: Kwargs) -> Result<minijinja::Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Keys are in order already: a JSON object here is a sorted map.
    let _sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let value = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(minijinja::Value::from_safe_string(hf::tojson(
        &value, indent,
    )))
}

/// The model's tokenizer, chat template and stop tokens: how a prompt's ids
/// are made from a conversation, as the engine makes them. The proxy renders
/// with it ([`forgelog_dialects::splice`]).
#[derive(Clone)]
pub struct ChatCodec {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Tokens that end a completion.
    pub stop_token_ids: Vec<u32>,
    stops: Vec<(u32, String)>,
    /// Shared by the clones: the proxy's handlers each hold one.
    pieces: Option<Arc<SegmentCache>>,
}

impl ChatCodec {
    pub fn new(
        tokenizer: Tokenizer,
        template: ChatTemplate,
        stop_token_ids: Vec<u32>,
    ) -> ChatCodec {
        let stops = stop_token_ids
            .iter()
            .filter_map(|&id| Some((id, tokenizer.id_to_token(id)?)))
            .collect();
        let pieces = SegmentCache::of(&tokenizer, Self::REMEMBERED_BYTES).map(Arc::new);
        ChatCodec {
            tokenizer,
            template,
            stop_token_ids,
            stops,
            pieces,
        }
    }

    /// What the pieces of prompts it remembers may take: a long harness's
    /// system prompt and tools are about 100 KB of text and ids.
    pub const REMEMBERED_BYTES: u64 = 32 << 20;

    /// The ids of `text` encoded as one, no piece remembered.
    fn encode_whole(&self, text: &str) -> Result<Vec<u32>, String> {
        // The ids alone: without offsets, about twice as fast.
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("tokenizer: {e}"))
    }

    /// SHA-256 (hex) of the tokenizer as `tokenizer.json` writes it, and of
    /// the template's source: what a call's log records it was rendered with.
    pub fn sha256s(&self) -> (String, String) {
        use forgelog_schemas::content_hash;
        let tokenizer = self.tokenizer.to_string(false).unwrap_or_default();
        (
            content_hash(tokenizer.as_bytes()),
            content_hash(self.template.source().as_bytes()),
        )
    }
}

impl ChatRenderer for ChatCodec {
    fn render(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        self.template
            .render(messages, tools, add_generation_prompt)
            .map_err(|e| e.to_string())
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match &self.pieces {
            Some(pieces) => pieces.encode(text, |t| self.encode_whole(t)),
            None => self.encode_whole(text),
        }
    }

    fn stop_tokens(&self) -> &[(u32, String)] {
        &self.stops
    }
}

/// What Hugging Face templates expect of a message ([`hf::hf_message`]);
/// with `!renders_tool_calls`, the calls appended to the content as Hermes text.
fn normalize_message(message: &Value, renders_tool_calls: bool) -> Cow<'_, Value> {
    if renders_tool_calls {
        hf::hf_message(message)
    } else {
        hf::hf_message_with_hermes_calls(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chatml_renders_messages_and_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>");
        let text = t
            .render(
                &[
                    json!({"role": "user", "content": [{"type": "text", "text": "Hi"}]}),
                    json!({"role": "assistant", "content": null}),
                ],
                None,
                true,
            )
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tool_calls_become_hermes_text_when_the_template_ignores_them() {
        let call = json!({"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{\"x\": 1}"}}]});
        let plain = ChatTemplate::new(CHATML, "", "<|im_end|>");
        let text = plain
            .render(std::slice::from_ref(&call), None, false)
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>assistant\nLet me compute.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"x\":1}}\n</tool_call><|im_end|>\n"
        );
        // A template that shows tool calls itself gets them untouched.
        let aware = ChatTemplate::new(
            "{% for m in messages %}{{ m.content }}|{% for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments.x }}{% endfor %}{% endfor %}",
            "",
            "",
        );
        assert_eq!(
            aware.render(&[call], None, false).unwrap(),
            "Let me compute.|calc1"
        );
    }

    #[test]
    fn tools_reach_the_template_and_errors_are_reported() {
        let source = "{% for t in tools %}{{ t.function.name }}{{ t | tojson }}{% endfor %}{% if not messages %}{{ raise_exception('no messages') }}{% endif %}";
        let t = ChatTemplate::new(source, "", "");
        let tools = json!([{"type": "function", "function": {"name": "add"}}]);
        let text = t
            .render(
                &[json!({"role": "user", "content": "x"})],
                Some(&tools),
                true,
            )
            .unwrap();
        assert!(text.starts_with("add{"), "{text}");
        let err = t.render(&[], Some(&tools), true).unwrap_err();
        assert!(err.to_string().contains("no messages"), "{err}");
    }

    /// `tojson` writes what Python's `json.dumps` writes (Hugging Face's
    /// filter): spaced separators, `<` and non-ASCII as they are, indented
    /// when asked (strings from `json.dumps` in CPython 3.11).
    #[test]
    fn tojson_writes_what_transformers_writes() {
        let t = ChatTemplate::new(
            "{{ messages[0].x | tojson }}|{{ messages[0].x | tojson(indent=2) }}|{{ [] | tojson }}",
            "",
            "",
        );
        let x = json!({"b": [1, 2.5, null, true], "a": "x < y & 'é'\n", "c": {}});
        let text = t
            .render(
                &[json!({"role": "user", "content": "", "x": x})],
                None,
                false,
            )
            .unwrap();
        assert_eq!(
            text,
            "{\"a\": \"x < y & 'é'\\n\", \"b\": [1, 2.5, null, true], \"c\": {}}|\
             {\n  \"a\": \"x < y & 'é'\\n\",\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"c\": {}\n}|[]"
        );
    }
}

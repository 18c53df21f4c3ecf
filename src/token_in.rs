//! The proxy's tokenizer and chat template (token in): loaded from the model
//! named (`smollm2`, a .gguf file, a Hugging Face folder), never a hub.

use anyhow::Context;
use forgelog_producers::upstream::TokenIn;
use std::sync::Arc;

/// The tokenizer and template of `spec`; `none` (or no spec): the engine
/// renders chats itself.
pub fn load(spec: Option<&str>) -> anyhow::Result<Option<TokenIn>> {
    let Some(spec) = spec.filter(|s| *s != "none") else {
        return Ok(None);
    };
    let codec = forgelog_model::load_chat_codec(spec, &forgelog_stream::models_dir())
        .with_context(|| format!("cannot load the tokenizer and chat template of {spec:?}"))?;
    let (tokenizer_sha256, chat_template_sha256) = codec.sha256s();
    Ok(Some(TokenIn {
        renderer: Arc::new(codec),
        tokenizer_sha256,
        chat_template_sha256,
    }))
}

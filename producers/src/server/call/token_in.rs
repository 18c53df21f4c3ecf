//! Token in: the call's prompt ids made by the proxy, spliced onto an
//! earlier call of the session or rendered, and how, for its record.

use super::Call;
use crate::upstream::TokenIn;
use forgelog_dialects::dialect::DialectError;
use forgelog_dialects::splice::{self, Made};
use forgelog_schemas::PromptMade;
use serde_json::Value;

fn messages_of(chat: &Value) -> &[Value] {
    chat["messages"].as_array().map_or(&[], Vec::as_slice)
}

pub(super) fn tools_of(chat: &Value) -> Option<&Value> {
    chat.get("tools").filter(|t| !t.is_null())
}

/// How a prompt was made, as `CallFinished` records it.
pub(super) fn made(made: &Made, token_in: &TokenIn) -> PromptMade {
    let (spliced_from, why_rendered) = match made {
        Made::Spliced { base_call } => (Some(*base_call), None),
        Made::Rendered { why } => (None, Some(why.clone())),
    };
    PromptMade {
        spliced_from,
        why_rendered,
        tokenizer_sha256: token_in.tokenizer_sha256.clone(),
        chat_template_sha256: token_in.chat_template_sha256.clone(),
    }
}

impl Call {
    /// The call's prompt ids, spliced onto an earlier call of the session
    /// where it extends one; a template that cannot render it is the
    /// harness's bad request.
    pub(super) fn prompt(
        &self,
        token_in: &TokenIn,
        chat: &Value,
    ) -> Result<splice::Prompt, DialectError> {
        let mut answered = self.session.answered();
        let prompt = splice::prompt(
            answered.make_contiguous(),
            messages_of(chat),
            tools_of(chat),
            token_in.renderer.as_ref(),
        )
        .map_err(|e| DialectError::invalid(format!("the model's chat template: {e}")))?;
        let kind = match prompt.made {
            Made::Spliced { .. } => "spliced",
            Made::Rendered { .. } => "rendered",
        };
        metrics::counter!("forgelog_proxy_prompts_total", "made" => kind).increment(1);
        Ok(prompt)
    }
}

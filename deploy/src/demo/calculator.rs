//! The demo agent's one real tool: an arithmetic calculator.

use forgelog_dialects::canonical::ToolSpec;
use serde_json::Value;

pub const NAME: &str = "calculator";

/// The tool as the agent declares it.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: NAME.into(),
        description: Some(
            "Evaluates an arithmetic expression such as (12 + 5) * 3 and returns the result."
                .into(),
        ),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the arithmetic expression"}},
            "required": ["expression"],
        }),
    }
}

/// Runs the tool on the model's arguments (JSON text, as the model wrote it);
/// returns what goes back to the model as the tool result, errors included (a
/// model learns from its failed calls too).
pub fn call(arguments: &str) -> String {
    let arguments: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
    let Some(expr) = arguments.get("expression").and_then(Value::as_str) else {
        return "error: missing string argument 'expression'".into();
    };
    match evaluate(expr) {
        Ok(v) => v,
        Err(e) => format!("error: {e}"),
    }
}

/// Integer and float arithmetic (`+ - * / % ^`, parentheses); nothing else:
/// the model's text is untrusted input.
pub fn evaluate(expr: &str) -> Result<String, String> {
    if expr.len() > 200 {
        return Err("expression longer than 200 characters".into());
    }
    if let Some(c) = expr
        .chars()
        .find(|c| !(c.is_ascii_digit() || " \t.+-*/%^()".contains(*c)))
    {
        return Err(format!("unsupported character {c:?}"));
    }
    match evalexpr::eval(expr).map_err(|e| e.to_string())? {
        evalexpr::Value::Int(i) => Ok(i.to_string()),
        evalexpr::Value::Float(f) if f.is_finite() => Ok(format!("{f}")),
        other => Err(format!("not a number: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluates_arithmetic_and_refuses_the_rest() {
        assert_eq!(evaluate("(12 + 5) * 3").unwrap(), "51");
        assert_eq!(evaluate("7 / 2.0").unwrap(), "3.5");
        assert!(evaluate("1 / 0").is_err());
        assert!(evaluate("a = 3")
            .unwrap_err()
            .contains("unsupported character"));
        assert!(evaluate("2 +").is_err());
        assert_eq!(call(r#"{"expression": "6*7"}"#), "42");
        assert!(call(r#"{"expr": "6*7"}"#).starts_with("error:"));
        assert!(call("not json").starts_with("error:"));
    }
}

//! Structured outputs, as vLLM takes them (`"structured_outputs": {"regex": …}`
//! or `{"choice": […]}`): the whole completion matches a regular expression.
//!
//! The expression is compiled to a DFA over bytes. At each step a token may
//! be drawn when its bytes, fed from the current state, keep the DFA alive; a
//! stop token only where the text so far matches. Masked tokens get −∞ before
//! the logprobs are taken, so the reported logprob is that of the constrained
//! distribution, as vLLM reports it: a token the expression forces has logprob
//! 0. (Pure: no I/O, no clock.)

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tokenizers::{DecoderWrapper, Tokenizer};

/// The most memory one expression's DFA may take: an expression that would
/// need more is refused, not compiled (it arrives from any client).
const DFA_BYTES: usize = 8 << 20;

/// The constraint a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum StructuredOutput {
    Regex(String),
    /// One of these strings, exactly.
    Choice(Vec<String>),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GrammarError {
    #[error("structured_outputs.{0} is not supported by the forgelog engine; it supports regex and choice")]
    Unsupported(String),
    #[error("structured_outputs needs exactly one of regex and choice")]
    NotOne,
    #[error("structured_outputs.{0} must be {1}")]
    Shape(&'static str, &'static str),
    #[error("structured_outputs.regex: {0}")]
    Regex(String),
}

/// The constraints vLLM's `structured_outputs` can hold; its other keys are
/// options (`disable_fallback`, `whitespace_pattern`…), which a regex or a
/// choice does not read.
const CONSTRAINTS: [&str; 6] = [
    "regex",
    "choice",
    "json",
    "json_object",
    "grammar",
    "structural_tag",
];

impl StructuredOutput {
    /// From the request's `structured_outputs` object.
    pub fn from_fields(fields: &Map<String, Value>) -> Result<StructuredOutput, GrammarError> {
        let asked: Vec<&str> = CONSTRAINTS
            .into_iter()
            .filter(|k| fields.get(*k).is_some_and(|v| !v.is_null()))
            .collect();
        let [constraint] = asked[..] else {
            return Err(GrammarError::NotOne);
        };
        match (constraint, &fields[constraint]) {
            ("regex", Value::String(regex)) => Ok(StructuredOutput::Regex(regex.clone())),
            ("regex", _) => Err(GrammarError::Shape("regex", "a string")),
            ("choice", Value::Array(items)) if !items.is_empty() => items
                .iter()
                .map(|c| c.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(StructuredOutput::Choice)
                .ok_or(GrammarError::Shape(
                    "choice",
                    "a non-empty array of strings",
                )),
            ("choice", _) => Err(GrammarError::Shape(
                "choice",
                "a non-empty array of strings",
            )),
            (other, _) => Err(GrammarError::Unsupported(other.to_string())),
        }
    }

    fn pattern(&self) -> String {
        match self {
            StructuredOutput::Regex(regex) => regex.clone(),
            StructuredOutput::Choice(choices) => choices
                .iter()
                .map(|c| regex_syntax::escape(c))
                .collect::<Vec<_>>()
                .join("|"),
        }
    }
}

/// Every token's bytes as the model emits them; `None` for a special token,
/// which is never text (stop tokens are decided apart).
#[derive(Debug)]
pub struct Vocabulary(Vec<Option<Box<[u8]>>>);

impl Vocabulary {
    /// Byte-level BPE (GPT-2, llama 3, Qwen, SmolLM2) maps each byte to a
    /// printable character; SentencePiece spells a space `▁` and a byte it
    /// has no piece for `<0xNN>`. Added tokens that are not special are
    /// their content, as written.
    pub fn of(tokenizer: &Tokenizer) -> Vocabulary {
        let byte_level = is_byte_level(tokenizer.get_decoder());
        let char_byte = gpt2_char_bytes();
        let mut tokens: Vec<Option<Box<[u8]>>> = vec![None; tokenizer.get_vocab_size(true)];
        for (piece, id) in tokenizer.get_vocab(false) {
            let bytes = if byte_level {
                piece.chars().map(|c| char_byte.get(&c).copied()).collect()
            } else {
                Some(sentencepiece_bytes(&piece))
            };
            if let Some(slot) = tokens.get_mut(id as usize) {
                *slot = bytes.map(Vec::into_boxed_slice);
            }
        }
        for (id, added) in tokenizer.get_added_tokens_decoder() {
            if let Some(slot) = tokens.get_mut(id as usize) {
                *slot = (!added.special).then(|| added.content.as_bytes().into());
            }
        }
        Vocabulary(tokens)
    }

    fn bytes(&self, token: usize) -> Option<&[u8]> {
        self.0.get(token)?.as_deref().filter(|b| !b.is_empty())
    }
}

fn is_byte_level(decoder: Option<&DecoderWrapper>) -> bool {
    match decoder {
        Some(DecoderWrapper::ByteLevel(_)) => true,
        Some(DecoderWrapper::Sequence(s)) => {
            s.get_decoders().iter().any(|d| is_byte_level(Some(d)))
        }
        _ => false,
    }
}

/// GPT-2's `bytes_to_unicode`, reversed: printable bytes stand for
/// themselves, the others for the characters from U+0100 on, in order.
fn gpt2_char_bytes() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).expect("below U+0200")
            };
            (c, b)
        })
        .collect()
}

fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    let hex = piece
        .strip_prefix("<0x")
        .and_then(|h| h.strip_suffix('>'))
        .filter(|h| h.len() == 2);
    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
        Some(byte) => vec![byte],
        None => piece.replace('▁', " ").into_bytes(),
    }
}

/// One request's constraint and where its completion has got to.
#[derive(Debug, Clone)]
pub struct TokenGrammar {
    dfa: Arc<dense::DFA<Vec<u32>>>,
    vocabulary: Arc<Vocabulary>,
    state: StateID,
    /// Whether some completion from a state can still match (a memo of
    /// [`TokenGrammar::can_match_from`]).
    live: HashMap<StateID, bool>,
}

impl TokenGrammar {
    pub fn new(
        output: &StructuredOutput,
        vocabulary: Arc<Vocabulary>,
    ) -> Result<TokenGrammar, GrammarError> {
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    // Every alternative stays open: leftmost-first would
                    // drop "Paris" once "Pa" of "Pa|Paris" had matched.
                    .match_kind(MatchKind::All)
                    .dfa_size_limit(Some(DFA_BYTES))
                    .determinize_size_limit(Some(DFA_BYTES)),
            )
            .build(&output.pattern())
            .map_err(|e| GrammarError::Regex(e.to_string()))?;
        let state = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| GrammarError::Regex(e.to_string()))?;
        Ok(TokenGrammar {
            dfa: Arc::new(dfa),
            vocabulary,
            state,
            live: HashMap::new(),
        })
    }

    /// Where the DFA goes on `bytes` from the current state; `None` once no
    /// completion can match.
    fn walk(&mut self, bytes: &[u8]) -> Option<StateID> {
        let mut state = self.state;
        for &b in bytes {
            state = self.dfa.next_state(state, b);
            if self.dfa.is_dead_state(state) || self.dfa.is_quit_state(state) {
                return None;
            }
        }
        let dfa = &self.dfa;
        let live = *self
            .live
            .entry(state)
            .or_insert_with(|| can_match_from(dfa, state));
        live.then_some(state)
    }

    /// Whether the text so far matches the whole expression.
    fn matched(&self) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(self.state))
    }

    /// Sets the logits of the tokens the expression does not allow next to
    /// −∞. A stop token keeps its logit where the text so far matches, and
    /// where no token can go on (an expression the vocabulary cannot
    /// spell): the completion ends rather than runs on unconstrained.
    pub fn mask(&mut self, logits: &mut [f32], stop_tokens: &[u32]) {
        let stops: Vec<(usize, f32)> = stop_tokens
            .iter()
            .filter_map(|&s| Some((s as usize, *logits.get(s as usize)?)))
            .collect();
        let mut open = false;
        let vocabulary = self.vocabulary.clone();
        for (token, logit) in logits.iter_mut().enumerate() {
            match vocabulary.bytes(token) {
                Some(bytes) if self.walk(bytes).is_some() => open = true,
                _ => *logit = f32::NEG_INFINITY,
            }
        }
        if self.matched() || !open {
            for (stop, logit) in stops {
                logits[stop] = logit;
            }
        }
    }

    /// Moves past `token`, which [`TokenGrammar::mask`] allowed (a stop
    /// token ends the completion and moves nothing).
    pub fn advance(&mut self, token: u32) {
        let vocabulary = self.vocabulary.clone();
        if let Some(state) = vocabulary.bytes(token as usize).and_then(|b| self.walk(b)) {
            self.state = state;
        }
    }
}

/// Whether text from `state` on can still match. Not merely "not dead":
/// the DFA reports a match one byte late, so the state after the byte that
/// follows a complete match ("Paris" then "x") is a live-looking match
/// state from which every byte, and the end, lead nowhere.
fn can_match_from(dfa: &dense::DFA<Vec<u32>>, state: StateID) -> bool {
    if !dfa.is_match_state(state) {
        return true;
    }
    dfa.is_match_state(dfa.next_eoi_state(state))
        || (0..=255u8).any(|b| {
            let next = dfa.next_state(state, b);
            !dfa.is_dead_state(next) && !dfa.is_quit_state(next)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{sample, Rng, SamplerConfig};
    use forgelog_model::testing::tiny_tokenizer;
    use serde_json::json;

    const STOP: u32 = 2;

    fn grammar(output: StructuredOutput) -> TokenGrammar {
        TokenGrammar::new(&output, Arc::new(Vocabulary::of(&tiny_tokenizer()))).unwrap()
    }

    fn allowed(grammar: &mut TokenGrammar, vocab: usize) -> Vec<usize> {
        let mut logits = vec![0.0; vocab];
        grammar.mask(&mut logits, &[STOP]);
        (0..vocab).filter(|&t| logits[t].is_finite()).collect()
    }

    #[test]
    fn a_token_is_the_bytes_the_tokenizer_decodes_it_to() {
        let tokenizer = tiny_tokenizer();
        let vocabulary = Vocabulary::of(&tokenizer);
        for text in ["The capital of France is Paris.", "café ✓ {\"a\": 1}\n"] {
            let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
            let spelled: Vec<u8> = ids
                .iter()
                .flat_map(|&t| vocabulary.bytes(t as usize).unwrap().to_vec())
                .collect();
            assert_eq!(spelled, text.as_bytes(), "{ids:?}");
        }
        // Special tokens are never text.
        assert_eq!(vocabulary.bytes(STOP as usize), None);
    }

    #[test]
    fn a_choice_allows_its_prefixes_and_stops_only_where_it_is_complete() {
        let tokenizer = tiny_tokenizer();
        let vocab = tokenizer.get_vocab_size(true);
        let mut g = grammar(StructuredOutput::Choice(vec!["Paris".into(), "Pa".into()]));
        let first = allowed(&mut g, vocab);
        assert!(!first.is_empty() && !first.contains(&(STOP as usize)));
        for &t in &first {
            let piece = tokenizer.decode(&[t as u32], false).unwrap();
            assert!("Paris".starts_with(&piece), "{piece:?} was allowed");
        }
        for t in tokenizer.encode("Pa", false).unwrap().get_ids() {
            g.advance(*t);
        }
        // "Pa" may end here or go on to "Paris".
        let after_pa = allowed(&mut g, vocab);
        assert!(after_pa.contains(&(STOP as usize)) && after_pa.len() > 1);
        for t in tokenizer.encode("ris", false).unwrap().get_ids() {
            g.advance(*t);
        }
        assert_eq!(allowed(&mut g, vocab), vec![STOP as usize]);
    }

    /// Sampled freely under the mask, every completion that stops matches
    /// the whole expression, and a forced token has logprob 0.
    #[test]
    fn sampled_completions_match_the_expression() {
        let tokenizer = tiny_tokenizer();
        let vocab = tokenizer.get_vocab_size(true);
        let pattern = r#"<tool_call>\{"name": "bash", "arguments": \{"command": "(ls /app|cat /app/[a-z]{1,8}\.txt)"\}\}</tool_call>"#;
        let whole = regex::bytes::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        let mut rng = Rng::new(7);
        let mut forced = 0;
        for seed in 0..64 {
            let mut g = grammar(StructuredOutput::Regex(pattern.into()));
            let mut text = Vec::new();
            let mut noise = Rng::new(seed);
            loop {
                let mut logits: Vec<f32> = (0..vocab)
                    .map(|_| (noise.next_f64() * 8.0) as f32)
                    .collect();
                g.mask(&mut logits, &[STOP]);
                let s = sample(&logits, &SamplerConfig::default(), &mut rng);
                if s.token == STOP {
                    break;
                }
                if allowed(&mut g, vocab).len() == 1 {
                    assert_eq!(s.logprob, 0.0);
                    forced += 1;
                }
                g.advance(s.token);
                text.extend_from_slice(g.vocabulary.bytes(s.token as usize).unwrap());
                assert!(text.len() < 200, "{}", String::from_utf8_lossy(&text));
            }
            assert!(whole.is_match(&text), "{}", String::from_utf8_lossy(&text));
        }
        assert!(forced > 0);
    }

    #[test]
    fn what_the_engine_cannot_honour_is_refused_by_name() {
        let parse = |v: Value| StructuredOutput::from_fields(v.as_object().unwrap());
        assert_eq!(
            parse(json!({"choice": ["a", "b"], "disable_fallback": true})),
            Ok(StructuredOutput::Choice(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            parse(json!({"json": {"type": "object"}})),
            Err(GrammarError::Unsupported("json".into()))
        );
        assert_eq!(
            parse(json!({"regex": "a", "choice": ["a"]})),
            Err(GrammarError::NotOne)
        );
        assert_eq!(parse(json!({})), Err(GrammarError::NotOne));
        assert!(matches!(
            parse(json!({"choice": [1]})),
            Err(GrammarError::Shape("choice", _))
        ));
        let vocabulary = Arc::new(Vocabulary::of(&tiny_tokenizer()));
        let compile =
            |r: &str| TokenGrammar::new(&StructuredOutput::Regex(r.into()), vocabulary.clone());
        assert!(matches!(compile("(unclosed"), Err(GrammarError::Regex(_))));
        // An expression whose DFA outgrows the bound is refused, not built.
        assert!(matches!(compile(r"\w{1000}"), Err(GrammarError::Regex(_))));
        // A choice is literal text, metacharacters and all.
        let choice = StructuredOutput::Choice(vec!["a.b".into()]);
        assert_eq!(choice.pattern(), r"a\.b");
    }
}

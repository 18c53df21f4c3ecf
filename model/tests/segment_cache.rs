//! Remembering the ids of a prompt's long pieces gives exactly the ids of
//! encoding the whole, for the real default model's tokenizer (SmolLM2, from
//! its GGUF) and the tiny test tokenizer; tokenizers where a piece's ids
//! depend on where it stands are not cached at all.

use forgelog_dialects::splice::ChatRenderer;
use forgelog_model::segment_cache::SegmentCache;
use forgelog_model::{load_chat_codec, load_tokenizer, testing};
use proptest::prelude::*;
use serde_json::json;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::{AddedToken, Tokenizer};

/// Built once: from the GGUF it takes a while in a debug build.
static SMOLLM2: std::sync::LazyLock<Tokenizer> = std::sync::LazyLock::new(|| {
    load_tokenizer("smollm2", &forgelog_stream::models_dir()).unwrap_or_else(|e| panic!("{e}"))
});

fn whole(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer
        .encode_fast(text, false)
        .unwrap()
        .get_ids()
        .to_vec()
}

/// Texts of the kind a template renders: added tokens (and near misses),
/// words, code, whitespace runs, non-ASCII, and long repeated pieces.
fn prompt_text() -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        Just("<|im_start|>".to_string()),
        Just("<|im_end|>".to_string()),
        Just("<|endoftext|>".to_string()),
        Just("<|im_sta".to_string()),
        Just("|>".to_string()),
        Just("\n".to_string()),
        Just("  \n\t ".to_string()),
        Just("system\n".to_string()),
        Just("{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\"}}".to_string()),
        Just("héllo wörld — ✓ 日本".to_string()),
        "[a-z ]{0,12}",
        ("[a-zA-Z0-9 .,;]{1,40}", 5..40usize).prop_map(|(s, n)| s.repeat(n)),
    ];
    prop::collection::vec(fragment, 0..24).prop_map(|f| f.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn pieces_remembered_give_the_ids_of_the_whole(texts in prop::collection::vec(prompt_text(), 1..4)) {
        for tokenizer in [&*SMOLLM2, &testing::tiny_tokenizer()] {
            let cache = SegmentCache::of(tokenizer, 1 << 20).expect("byte-level BPE is cached");
            // Twice: encoded fresh, then from memory.
            for text in texts.iter().chain(&texts) {
                let ids = cache.encode(text, |t| Ok(whole(tokenizer, t))).unwrap();
                prop_assert_eq!(ids, whole(tokenizer, text), "{:?}", text);
            }
        }
    }
}

#[test]
fn a_shared_system_prompt_is_encoded_once_and_memory_stays_in_its_budget() {
    let codec = load_chat_codec("smollm2", &forgelog_stream::models_dir()).unwrap();
    let system = "You are a coding agent. Use the bash tool. ".repeat(40);
    let render = |task: &str| {
        let messages = [
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": task}),
        ];
        codec.render(&messages, None, true).unwrap()
    };
    let encoded = std::cell::Cell::new(Vec::<usize>::new());
    let cache = SegmentCache::of(&codec.tokenizer, 1 << 20).unwrap();
    for task in ["fix the failing test", "add a --verbose flag"] {
        let text = render(task);
        let ids = cache
            .encode(&text, |t| {
                let mut seen = encoded.take();
                seen.push(t.len());
                encoded.set(seen);
                Ok(whole(&codec.tokenizer, t))
            })
            .unwrap();
        assert_eq!(ids, whole(&codec.tokenizer, &text));
        assert_eq!(codec.encode(&text).unwrap(), ids, "the codec's own path");
    }
    let encoded = encoded.take();
    let long = encoded.iter().filter(|&&n| n >= system.len()).count();
    assert_eq!(long, 1, "the system prompt encoded once: {encoded:?}");
    assert_eq!(cache.remembered().0, 1);

    let small = SegmentCache::of(&codec.tokenizer, 64 << 10).unwrap();
    for i in 0..200 {
        let text = render(&format!("task {i}: {}", "x".repeat(300)));
        let ids = small
            .encode(&text, |t| Ok(whole(&codec.tokenizer, t)))
            .unwrap();
        assert_eq!(ids, whole(&codec.tokenizer, &text));
    }
    let (pieces, bytes) = small.remembered();
    assert!(bytes <= 64 << 10, "{pieces} pieces, {bytes} bytes");
}

#[test]
fn tokenizers_whose_pieces_depend_on_where_they_stand_are_not_cached() {
    let mut first_only = testing::tiny_tokenizer();
    first_only.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::First, true)));
    assert!(SegmentCache::of(&first_only, 1 << 20).is_none());

    let mut always = testing::tiny_tokenizer();
    always.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    assert!(SegmentCache::of(&always, 1 << 20).is_some());

    let mut stripping = testing::tiny_tokenizer();
    stripping
        .add_special_tokens([AddedToken::from("<mask>", true).lstrip(true)])
        .unwrap();
    assert!(SegmentCache::of(&stripping, 1 << 20).is_none());
}

/// A GRPO group's rollouts start together and send one task: the first to
/// need its ids encodes it, the others wait for them rather than encoding it
/// again (the encode here is slow enough that they all arrive meanwhile).
#[test]
fn a_piece_wanted_at_once_by_many_is_encoded_once() {
    let tokenizer = testing::tiny_tokenizer();
    let cache = SegmentCache::of(&tokenizer, 1 << 20).unwrap();
    let task = format!(
        "<|im_start|>user\n{}<|im_end|>",
        "solve the task ".repeat(40)
    );
    let long_encodes = std::sync::atomic::AtomicUsize::new(0);
    let start = std::sync::Barrier::new(8);
    let results: Vec<Vec<u32>> = std::thread::scope(|s| {
        let rollouts: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    cache
                        .encode(&task, |t| {
                            if t.len() >= 256 {
                                long_encodes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                std::thread::sleep(std::time::Duration::from_millis(200));
                            }
                            Ok(whole(&tokenizer, t))
                        })
                        .unwrap()
                })
            })
            .collect();
        rollouts.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(long_encodes.into_inner(), 1, "the task encoded once");
    for ids in results {
        assert_eq!(ids, whole(&tokenizer, &task));
    }
}

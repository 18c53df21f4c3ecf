use super::*;
use candle_core::Device;
use forgelog_model::testing::{random_policy, tiny_config};

fn serving(version: u64) -> (Loop, Transformer) {
    let device = Device::Cpu;
    let policy = random_policy(&tiny_config(64), "tiny", &device).unwrap();
    let next = random_policy(&tiny_config(64), "tiny", &device).unwrap();
    let state = Loop {
        model: policy.model,
        tokenizer: Arc::new(policy.tokenizer),
        stop_token_ids: Vec::new(),
        version: Arc::new(AtomicU64::new(version)),
        admitted: Arc::default(),
        reused: Arc::default(),
        active: Vec::new(),
        seeds: 0,
        prefix_cache: PrefixCache::new(0),
    };
    (state, next.model)
}

/// A request admitted before a swap and prefilled after it was sampled
/// by the new weights: it says so (it used to carry the version it was
/// admitted under). One prefilled before the swap keeps its version.
#[test]
fn a_request_carries_the_version_that_prefilled_it() {
    let request = GenerationRequest {
        prompt: vec![1, 2, 3],
        max_tokens: 3,
        sampling: SamplerConfig::default(),
        stop: Vec::new(),
        ignore_eos: true,
        grammar: None,
    };
    let (mut state, next) = serving(4);
    let (early, mut early_answer) = oneshot::channel();
    state.apply(Command::Generate(request.clone(), Instant::now(), early));
    state.step();
    let (late, mut late_answer) = oneshot::channel();
    state.apply(Command::Generate(request, Instant::now(), late));
    let (swapped, _) = oneshot::channel();
    state.apply(Command::Swap(Box::new(next), 5, swapped));
    while !state.active.is_empty() {
        state.step();
    }
    let version = |answer: &mut oneshot::Receiver<Result<Generation, String>>| {
        answer.try_recv().unwrap().unwrap().policy_version
    };
    assert_eq!(version(&mut early_answer), 4, "prefilled before the swap");
    assert_eq!(
        version(&mut late_answer),
        5,
        "admitted before, prefilled after"
    );
}

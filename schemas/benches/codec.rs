//! Encode/decode throughput of a large CallFinished (2,000 prompt tokens, 256 sampled).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use forgelog_schemas::*;

fn call(prompt: usize, completion: usize) -> Event {
    testing::call_finished("run", "s", 0, prompt, completion).into()
}

fn codec(c: &mut Criterion) {
    let codec = Codec::global();
    for (prompt, completion) in [(2_000, 256), (100_000, 8_000)] {
        let event = call(prompt, completion);
        let bytes = codec.encode(&event).unwrap();
        let mut g = c.benchmark_group(format!("CallFinished_{prompt}p_{completion}c"));
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function("encode", |b| b.iter(|| codec.encode(&event).unwrap()));
        g.bench_function("decode", |b| b.iter(|| codec.decode(&bytes).unwrap()));
        g.finish();
    }
}

criterion_group!(benches, codec);
criterion_main!(benches);

//! The fake vLLM-compatible upstream as a process, for trying `forgelog proxy`
//! or `forgelog run` without an engine (and for the rollout bench):
//!
//! ```sh
//! cargo run -p forgelog-producers --example fake-upstream -- 127.0.0.1:18000 [AGENT_STEPS]
//! ```
//!
//! With AGENT_STEPS it plays a tiny agent in every conversation: that many
//! shell tool calls, then a final answer.

use forgelog_producers::fake_upstream::{self, FakeOptions};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:18000".into())
        .parse()
        .expect("usage: fake-upstream HOST:PORT [AGENT_STEPS]");
    let options = FakeOptions {
        agent_steps: args
            .next()
            .map(|n| n.parse().expect("AGENT_STEPS is a number")),
        ..Default::default()
    };
    let (addr, _) = fake_upstream::spawn(listen, options).await?;
    println!("fake upstream on http://{addr}");
    tokio::signal::ctrl_c().await
}

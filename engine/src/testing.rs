//! For tests in this and other crates: an engine serving on an ephemeral port.
//! The server runs on its own thread and runtime, so it outlives each
//! `#[tokio::test]` runtime.

use crate::access::ReloadAccess;
use crate::Engine;
use forgelog_model::Policy;
use std::sync::OnceLock;

pub struct Server {
    pub base: String,
    pub engine: Engine,
}

/// The admin token of the engines [`serve`] starts.
pub const ADMIN_TOKEN: &str = "engine-test-admin";

/// Serves `policy` until the test process exits; `/admin/reload` takes
/// [`ADMIN_TOKEN`] and checkpoints from anywhere on this machine.
pub fn serve(policy: Policy) -> Server {
    let access = ReloadAccess {
        admin_token: ADMIN_TOKEN.into(),
        checkpoint_root: Some(ReloadAccess::root("file:///").expect("a URL")),
        max_checkpoint_bytes: crate::DEFAULT_MAX_CHECKPOINT_BYTES,
    };
    serve_with(policy, access)
}

/// [`serve`] with `/admin/reload` under `access`.
pub fn serve_with(policy: Policy, access: ReloadAccess) -> Server {
    let engine = Engine::start(policy);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let base = format!("http://{}", listener.local_addr().expect("local addr"));
    let router = crate::server::router(engine.clone(), access);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            let _server = forgelog_http::HttpServer::start(listener, router, Default::default())
                .expect("engine serves");
            std::future::pending::<()>().await;
        });
    });
    Server { base, engine }
}

/// The default model, loaded once per test binary; panics (naming
/// `scripts/fetch-model.sh`) when the model file is absent.
pub fn smollm2() -> &'static (Server, Policy) {
    static SERVER: OnceLock<(Server, Policy)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let policy = forgelog_model::load_policy(
            "smollm2",
            &forgelog_stream::models_dir(),
            &candle_core::Device::Cpu,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        (serve(policy.clone()), policy)
    })
}

//! The `forgelog engine` process: load the model, serve HTTP, follow the
//! policy topic, and stop gracefully.

use crate::{follow_policy, server, Engine, EngineArgs, EngineError};

/// How long a stopping engine lets the requests in flight finish.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// `forgelog engine`: loads the model, serves until Ctrl-C, and follows the
/// policy topic when `--brokers` is given.
pub async fn run(args: EngineArgs) -> Result<(), EngineError> {
    serve(args, forgelog_stream::shutdown_signal()?).await
}

/// [`run`], stopping when `shutdown` completes (how `forgelog up` embeds it:
/// the engine lets go of the broker before the broker stops).
pub async fn serve(
    args: EngineArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), EngineError> {
    let listener = forgelog_http::listen(args.listen).await?;
    serve_on(listener, args, shutdown).await
}

/// [`serve`] on a listener already bound (`args.listen` is not used): an
/// embedding process binds port 0 and knows the port before the model loads.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    args: EngineArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), EngineError> {
    let device = args.device.open().map_err(EngineError::Device)?;
    let model = args.model.clone();
    let policy = tokio::task::spawn_blocking(move || {
        forgelog_model::load_policy(&model, &forgelog_stream::models_dir(), &device)
    })
    .await
    .map_err(|e| EngineError::Device(e.to_string()))??;
    let engine = Engine::start_with(policy, args.prefix_cache_mib);
    let follower = args.brokers.clone().map(|brokers| {
        let (engine, run) = (engine.clone(), args.run.clone());
        tokio::spawn(async move {
            if let Err(e) = follow_policy(engine, &brokers, run.as_deref()).await {
                tracing::error!("policy consumer stopped: {e}");
            }
        })
    });
    let access = args.reload_access()?;
    if args.admin_token.is_none() && access.checkpoint_root.is_some() {
        eprintln!(
            "engine admin token (for /admin/reload): {}",
            access.admin_token
        );
    }
    tracing::info!(model = engine.model_name(), listen = %listener.local_addr()?, "engine serving");
    let server = forgelog_http::HttpServer::start(
        listener,
        server::router(engine, access),
        Default::default(),
    )?;
    shutdown.await;
    server.shutdown(SHUTDOWN_GRACE).await;
    if let Some(f) = follower {
        f.abort();
        let _ = f.await; // its Kafka client is closed once this returns
    }
    Ok(())
}

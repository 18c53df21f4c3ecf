//! `forgelog run --backend kube`: its flags and the backend they make.

use anyhow::{Context, Result};
use forgelog_kube::names::PodLabels;
use forgelog_kube::{BundleSource, KubeBackend, KubeOptions, TaskImages};
use forgelog_podman::Podman;
use std::net::SocketAddr;
use std::time::Duration;

/// `--backend kube`.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// The API server (plain URL, no credentials; default: KUBECONFIG or the in-cluster config)
    #[arg(long)]
    pub kube_api: Option<String>,
    /// The namespace the run's Jobs go to
    #[arg(long, default_value = "forgelog")]
    pub namespace: String,
    /// The proxy as pods reach it (default: http://forgelog-proxy:<the proxy's port>)
    #[arg(long, value_parser = forgelog_http::http_url_arg)]
    pub kube_proxy_url: Option<String>,
    /// Labels of the proxy's pods: the run's NetworkPolicy lets pods reach only them (and DNS)
    #[arg(long, default_value = "app.kubernetes.io/name=forgelog-proxy")]
    pub kube_proxy_labels: PodLabels,
    /// The harness bundles as an image: `image:REF` (image volume), `copy:REF`
    /// (an init container copies them), or `hostpath:DIR` (default: the bundles here)
    #[arg(long)]
    pub bundles: Option<BundleSource>,
    /// Task images are PREFIX/forgelog-task-ID:latest, pushed beforehand (default: built here with podman)
    #[arg(long)]
    pub image_registry: Option<String>,
    /// A pod Pending longer than this is infra:schedule
    #[arg(long, default_value_t = 300)]
    pub schedule_timeout_sec: u64,
    /// Job creations per second at most
    #[arg(long, default_value_t = 10.0)]
    pub creates_per_second: f64,
    /// The run's lease: renewed every third of this; a run not renewed for
    /// this long is deleted, with all its Jobs, by the next `forgelog run`
    #[arg(long, default_value_t = 30)]
    pub lease_seconds: u64,
}

pub async fn kube_backend(
    args: &KubeArgs,
    run_id: &str,
    proxy: SocketAddr,
    bundles: &std::path::Path,
    podman: Podman,
) -> Result<KubeBackend> {
    let client = match &args.kube_api {
        Some(url) => kube::Client::try_from(kube::Config::new(url.parse()?))?,
        None => kube::Client::try_default()
            .await
            .context("no Kubernetes configuration (KUBECONFIG, in-cluster, or --kube-api)")?,
    };
    let options = KubeOptions {
        namespace: args.namespace.clone(),
        proxy_url: args
            .kube_proxy_url
            .clone()
            .unwrap_or_else(|| format!("http://forgelog-proxy:{}", proxy.port())),
        proxy_labels: args.kube_proxy_labels.0.clone(),
        proxy_port: i32::from(proxy.port()),
        bundles: args
            .bundles
            .clone()
            .unwrap_or_else(|| BundleSource::HostPath(bundles.to_string_lossy().into_owned())),
        images: match &args.image_registry {
            Some(prefix) => TaskImages::Registry(prefix.clone()),
            None => TaskImages::BuiltLocally(std::sync::Arc::new(podman)),
        },
        schedule_timeout: Duration::from_secs(args.schedule_timeout_sec),
        creates_per_second: args.creates_per_second,
        lease_seconds: args.lease_seconds,
        reconcile_every: Duration::from_secs(30),
    };
    Ok(KubeBackend::start(client, options, run_id).await?)
}

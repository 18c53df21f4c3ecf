//! A Kubernetes control plane small enough to run in a test, for a machine
//! where no real API server can be installed: [`store`] keeps the objects,
//! [`server`] serves them over HTTP the way `kube` calls them, and
//! [`kubelet`] runs each Job's pod through the local podman backend.
//! Nothing here is a real cluster; the tests say so and the README gives
//! the command to run the same suite against one.

pub mod kubelet;
pub mod server;
pub mod store;

use forgelog_podman::Podman;
use std::net::SocketAddr;
use std::sync::Arc;

/// What runs the Jobs' pods.
#[derive(Debug, Clone, Copy)]
pub enum Pods {
    /// Nothing: Jobs stay without pods.
    None,
    /// Each pod in a podman sandbox, reaching the proxy at this address as
    /// `http://forgelog-proxy:PORT`.
    Podman(SocketAddr),
    /// Each pod ends at once as a reference solution that scored 1 (for the
    /// bench: the orchestrator and the API path, no containers).
    Instant,
}

pub struct FakeCluster {
    /// The API server's URL (plain HTTP, no auth).
    pub url: String,
    pub server: Arc<server::Server>,
    stop_kubelet: Option<tokio::sync::oneshot::Sender<()>>,
    serve: tokio::task::JoinHandle<()>,
}

impl FakeCluster {
    /// An API server on 127.0.0.1 and a kubelet running its Jobs' pods as `pods` says.
    pub async fn start(pods: Pods) -> std::io::Result<FakeCluster> {
        let store = Arc::new(store::Store::default());
        let server = Arc::new(server::Server {
            store: store.clone(),
            faults: Default::default(),
            requests: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let app = server.clone().router();
        let serve = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let kubelet = match pods {
            Pods::None => None,
            Pods::Podman(proxy) => {
                Some(kubelet::Kubelet::new(store, Some(Podman::default()), proxy))
            }
            Pods::Instant => Some(kubelet::Kubelet::new(
                store,
                None,
                "127.0.0.1:9".parse().expect("an address"),
            )),
        };
        let stop_kubelet = kubelet.map(|kubelet| {
            let (stop, stopped) = tokio::sync::oneshot::channel();
            tokio::spawn(kubelet.run(stopped));
            stop
        });
        Ok(FakeCluster {
            url,
            server,
            stop_kubelet,
            serve,
        })
    }

    pub fn store(&self) -> &store::Store {
        &self.server.store
    }

    /// The next `n` requests are answered `code` (500, 429...).
    pub fn fail_next(&self, n: usize, code: u16) {
        self.server
            .faults
            .lock()
            .expect("faults")
            .extend(std::iter::repeat_n(code, n));
    }

    /// A `kube` client for it.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().expect("a URL"));
        kube::Client::try_from(config).expect("a client")
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        if let Some(stop) = self.stop_kubelet.take() {
            let _ = stop.send(());
        }
        self.serve.abort();
    }
}

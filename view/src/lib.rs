//! `forgelog view`: the trajectory viewer. A [`LogTail`] reads every topic of
//! the log (or one run of it, or a run's bundle) into a [`ViewIndex`] and
//! keeps reading as events arrive; [`router`] serves the pages [`forgelog_view_core::Pages`] renders,
//! and tells open pages when their run has new events (server-sent events).

mod server;
mod tail;

pub use forgelog_view_core::{NoTokenizer, Pages, TokenText, ViewIndex};
pub use server::{router, ViewState};
pub use tail::LogTail;

use forgelog_http::{HttpOptions, HttpServer};
use forgelog_stream::{ConsumeError, LogReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error(transparent)]
    Log(#[from] ConsumeError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How often the tail asks the log for new events.
const POLL: Duration = Duration::from_millis(300);

/// A serving viewer.
pub struct Viewer {
    server: HttpServer,
    stop: Arc<AtomicBool>,
    tail: std::thread::JoinHandle<()>,
    /// Events read before serving began.
    pub events_read: usize,
    pub runs: usize,
}

impl Viewer {
    /// Reads the log (or a bundle) as it is now (so the first page is
    /// whole), then serves on `listener` and keeps reading what arrives.
    pub async fn start(
        log: impl LogReader + Send + 'static,
        run: Option<String>,
        listener: TcpListener,
        tokens: Arc<dyn TokenText>,
    ) -> Result<Viewer, ViewError> {
        let (tail, index, events_read) = tokio::task::spawn_blocking(move || {
            let mut tail = LogTail::new(log, run);
            let mut index = ViewIndex::default();
            let read = tail.poll(|e| index.ingest(e))?;
            Ok::<_, ConsumeError>((tail, index, read))
        })
        .await
        .map_err(std::io::Error::other)??;
        let runs = index.runs().count();
        let index = Arc::new(RwLock::new(index));
        let (changed, changes) = watch::channel(0);
        let stop = Arc::new(AtomicBool::new(false));
        let tail = std::thread::spawn({
            let (index, stop) = (index.clone(), stop.clone());
            move || follow(tail, &index, &changed, &stop)
        });
        let state = ViewState {
            index,
            pages: Arc::new(Pages::new()),
            tokens,
            changes,
        };
        let server = HttpServer::start(listener, router(state), HttpOptions::default())?;
        Ok(Viewer {
            server,
            stop,
            tail,
            events_read,
            runs,
        })
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr()
    }

    /// Stops serving (open live pages are cut) and reading.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.server.shutdown(Duration::from_secs(1)).await;
        let _ = tokio::task::spawn_blocking(move || self.tail.join()).await;
    }
}

/// Reads what arrives until stopped; a broker that goes away is waited for.
fn follow(
    mut tail: LogTail<impl LogReader>,
    index: &RwLock<ViewIndex>,
    changed: &watch::Sender<u64>,
    stop: &AtomicBool,
) {
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(POLL);
        let mut fresh = Vec::new();
        match tail.poll(|e| fresh.push(e)) {
            Ok(_) if failing => {
                tracing::info!("view: reading the log again");
                failing = false;
            }
            Ok(_) => {}
            Err(e) if !failing => {
                tracing::warn!("view: cannot read the log ({e}); showing what was read, retrying");
                failing = true;
            }
            Err(_) => {}
        }
        // Events read before an error are kept: the tail resumes after them.
        if !fresh.is_empty() {
            let mut index = index.write().unwrap_or_else(|p| p.into_inner());
            fresh.into_iter().for_each(|e| index.ingest(e));
            changed.send_replace(index.generation());
        }
    }
}

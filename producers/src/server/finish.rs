//! A call's work runs in the task that awaits its answer: no hand-off to a
//! task of its own and back, each a wake-up of another worker thread (a
//! measurable part of the proxy's CPU per call). It still runs to its end, and
//! is recorded, when the harness hangs up: dropped unfinished, what is left
//! of it is spawned.

use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

type Work<T> = Pin<Box<dyn Future<Output = std::thread::Result<T>> + Send>>;

/// Work that finishes even if whoever awaits it goes away. Gives its output,
/// or [`Panicked`] (as a spawned task's handle would).
pub(super) struct FinishesAnyway<T: Send + 'static> {
    work: Option<Work<T>>,
}

/// The work panicked.
#[derive(Debug, PartialEq)]
pub(super) struct Panicked;

impl<T: Send + 'static> FinishesAnyway<T> {
    pub(super) fn new(work: impl Future<Output = T> + Send + 'static) -> Self {
        FinishesAnyway {
            work: Some(Box::pin(AssertUnwindSafe(work).catch_unwind())),
        }
    }
}

impl<T: Send + 'static> Future for FinishesAnyway<T> {
    type Output = Result<T, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let work = self.work.as_mut().expect("polled after it finished");
        let out = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(out.map_err(|_| Panicked))
    }
}

impl<T: Send + 'static> Drop for FinishesAnyway<T> {
    fn drop(&mut self) {
        // Outside a runtime (dropped as it shuts down) it cannot go on; the
        // proxy's shutdown records calls left in flight as interrupted.
        if let (Some(work), Ok(runtime)) = (self.work.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(work);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn work_dropped_unfinished_runs_to_its_end() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = FinishesAnyway::new(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            tx.send("done").unwrap();
        });
        assert!(tokio::time::timeout(Duration::from_millis(5), work)
            .await
            .is_err());
        assert_eq!(rx.await, Ok("done"));
    }

    #[tokio::test]
    async fn work_awaited_gives_its_output_or_its_panic() {
        assert_eq!(FinishesAnyway::new(async { 7 }).await, Ok(7));
        let panics = FinishesAnyway::new(async { panic!("the work failed") });
        assert_eq!(panics.await, Err::<(), _>(Panicked));
    }
}

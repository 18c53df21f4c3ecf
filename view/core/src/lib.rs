//! The trajectory viewer's pure core: the log's events of a run in, HTML pages
//! out; no I/O, no clock. [`ViewIndex`] holds what was read (runs and their
//! events, with the bytes no page shows left out), [`model`] turns a run into
//! what a page shows, and [`Pages`] renders it (minijinja templates compiled
//! into the binary; no front-end build, nothing fetched at run time).

mod index;
pub mod model;
mod pages;
mod report;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use index::{RunLog, ViewIndex};
pub use pages::{PageError, Pages, SCRIPT, STYLE};

/// The text of a token id, where the viewer knows the tokenizer.
pub trait TokenText: Send + Sync {
    fn token_text(&self, id: u32) -> Option<String>;
}

/// No tokenizer: tokens show as their ids.
pub struct NoTokenizer;

impl TokenText for NoTokenizer {
    fn token_text(&self, _id: u32) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests;

//! Export files: rows encoded as JSONL and Parquet (`encode`), the dataset
//! card (`card`), the streaming writers (`writer`) and the destination they
//! are copied to through object_store (`store`).

mod card;
mod encode;
mod store;
mod writer;

pub use card::dataset_card;
pub use encode::{jsonl, parquet, ROW_GROUP_ROWS, ROW_GROUP_TOKENS};
pub use store::Files;
pub use writer::{DocumentWriter, RowWriter};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("export destination {url}: {why}")]
    Destination { url: String, why: String },
    #[error("writing {path}: {source}")]
    Store {
        path: String,
        source: object_store::Error,
    },
    #[error("parquet: {0}")]
    Parquet(#[from] ::parquet::errors::ParquetError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl ExportError {
    pub(super) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ExportError {
        let what = what.into();
        move |source| ExportError::Io { what, source }
    }
}

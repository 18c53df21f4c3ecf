//! Object storage for checkpoints and exports: one way to open a location, so
//! what the trainer writes the engine can read and the exports land alike.
//!
//! A location is an object_store URL (`file:///abs/dir`, `s3://bucket/prefix`,
//! `gs://…`, `az://…`) or a plain path (relative to the working directory).
//! Credentials and endpoints come from the environment the way each cloud's
//! own tools read them (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, …).

use object_store::path::Path as StorePath;
use object_store::ObjectStore;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
#[error("{location}: {why}")]
pub struct StoreError {
    pub location: String,
    pub why: String,
}

/// An opened location: the store and the prefix inside it.
#[derive(Debug, Clone)]
pub struct Location {
    pub store: Arc<dyn ObjectStore>,
    /// The location's prefix in the store, without a trailing `/`.
    pub prefix: String,
    /// The location as a URL (`file://` for a plain path).
    pub url: url::Url,
}

impl Location {
    /// The path of `name` under this location.
    pub fn path(&self, name: &str) -> StorePath {
        StorePath::from(format!("{}/{name}", self.prefix).trim_start_matches('/'))
    }
}

/// The URL of `location`: itself when it has a scheme, else a `file://` URL of
/// the path (made absolute).
pub fn location_url(location: &str) -> Result<url::Url, StoreError> {
    let err = |why: String| StoreError {
        location: location.to_string(),
        why,
    };
    match url::Url::parse(location) {
        Ok(url) => Ok(url),
        Err(url::ParseError::RelativeUrlWithoutBase) => {
            let path = std::path::absolute(location).map_err(|e| err(e.to_string()))?;
            url::Url::from_directory_path(&path)
                .map_err(|()| err(format!("{} is not a usable path", path.display())))
        }
        Err(e) => Err(err(e.to_string())),
    }
}

/// Opens `location` to write into: as [`open`], and a local directory is
/// created first.
pub fn create(location: &str) -> Result<Location, StoreError> {
    let opened = open(location)?;
    if opened.url.scheme() == "file" {
        let err = |why: String| StoreError {
            location: location.to_string(),
            why,
        };
        let dir = opened
            .url
            .to_file_path()
            .map_err(|()| err("not a local path".into()))?;
        std::fs::create_dir_all(&dir).map_err(|e| err(e.to_string()))?;
    }
    Ok(opened)
}

/// Opens `location` (nothing is created: reading a location that is not
/// there fails when an object is read).
pub fn open(location: &str) -> Result<Location, StoreError> {
    let url = location_url(location)?;
    let err = |why: String| StoreError {
        location: location.to_string(),
        why,
    };
    let options = std::env::vars().filter(|(k, _)| {
        ["AWS_", "GOOGLE_", "AZURE_"]
            .iter()
            .any(|p| k.starts_with(p))
    });
    let (store, prefix) =
        object_store::parse_url_opts(&url, options).map_err(|e| err(e.to_string()))?;
    Ok(Location {
        store: Arc::from(store),
        prefix: prefix.as_ref().trim_end_matches('/').to_string(),
        url,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::{ObjectStoreExt, PutPayload};

    #[test]
    fn plain_paths_and_file_urls_open_the_same_directory() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let by_path = create(&dir.path().join("a/b").display().to_string()).unwrap();
        let by_url = open(&format!("file://{}/a/b", dir.path().display())).unwrap();
        assert!(dir.path().join("a/b").is_dir());
        rt.block_on(async {
            let put = PutPayload::from(b"hi".to_vec());
            by_path
                .store
                .put(&by_path.path("x/y.txt"), put)
                .await
                .unwrap();
            let got = by_url.store.get(&by_url.path("x/y.txt")).await.unwrap();
            assert_eq!(got.bytes().await.unwrap().as_ref(), b"hi");
        });
        assert_eq!(
            std::fs::read(dir.path().join("a/b/x/y.txt")).unwrap(),
            b"hi"
        );
        // Relative paths are the working directory's.
        let here = location_url("rel/dir").unwrap();
        assert_eq!(
            here.to_file_path().unwrap(),
            std::env::current_dir().unwrap().join("rel/dir")
        );
        assert!(open("s3://").is_err());
    }
}

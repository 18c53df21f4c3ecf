//! An export's destination: any object_store URL, each file checksummed.

use super::super::Manifest;
use super::ExportError;
use forgelog_stream::store::Location;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An export's destination and what has been written to it.
pub struct Files {
    location: Location,
    /// The URLs written, in order.
    written: Vec<String>,
    /// Name → SHA-256 (hex) of each file written.
    sha256: BTreeMap<String, String>,
}

impl Files {
    pub fn create(to: &str) -> Result<Files, ExportError> {
        let location =
            forgelog_stream::store::create(to).map_err(|e| ExportError::Destination {
                url: to.to_string(),
                why: e.why,
            })?;
        Ok(Files {
            location,
            written: Vec::new(),
            sha256: BTreeMap::new(),
        })
    }

    /// Writes the manifest last: it lists every other file's checksum, so it
    /// cannot hold its own. Returns every URL written.
    pub async fn finish(mut self, manifest: &mut Manifest) -> Result<Vec<String>, ExportError> {
        manifest.sha256 = std::mem::take(&mut self.sha256);
        let bytes = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
        self.put("manifest.json", bytes).await?;
        Ok(self.written)
    }

    /// Copies the local file `from` to `name` under the destination, a
    /// chunk at a time (a multipart upload where the store has them), noting
    /// its URL and checksum.
    pub(super) async fn put_file(&mut self, name: &str, from: &Path) -> Result<(), ExportError> {
        let path = self.location.path(name);
        let what = || format!("writing {path}");
        let mut upload =
            object_store::buffered::BufWriter::new(self.location.store.clone(), path.clone());
        let mut file = tokio::fs::File::open(from)
            .await
            .map_err(ExportError::io(from.display().to_string()))?;
        let mut hash = Sha256::new();
        let mut chunk = vec![0; 1 << 20];
        loop {
            let n = file
                .read(&mut chunk)
                .await
                .map_err(ExportError::io(from.display().to_string()))?;
            if n == 0 {
                break;
            }
            hash.update(&chunk[..n]);
            upload
                .write_all(&chunk[..n])
                .await
                .map_err(ExportError::io(what()))?;
        }
        upload.shutdown().await.map_err(ExportError::io(what()))?;
        self.sha256
            .insert(name.into(), format!("{:x}", hash.finalize()));
        let url = self.location.url.as_str().trim_end_matches('/');
        self.written.push(format!("{url}/{name}"));
        Ok(())
    }

    /// Writes `name` under the destination, noting its URL and checksum.
    pub(super) async fn put(&mut self, name: &str, bytes: Vec<u8>) -> Result<(), ExportError> {
        self.sha256
            .insert(name.into(), format!("{:x}", Sha256::digest(&bytes)));
        let path = self.location.path(name);
        self.location
            .store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|source| ExportError::Store {
                path: path.to_string(),
                source,
            })?;
        let url = self.location.url.as_str().trim_end_matches('/');
        self.written.push(format!("{url}/{name}"));
        Ok(())
    }
}

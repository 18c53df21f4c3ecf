//! Who may swap the policy over HTTP (`POST /admin/reload`), and from where:
//! the admin token, checkpoints only under one root URL (a file's symlinks
//! resolved first), policy versions only forward and by a bounded step,
//! checkpoints of a bounded size. Checks; the route applies them.

use crate::api::ApiError;
use url::Url;

#[derive(Debug, Clone)]
pub struct ReloadAccess {
    pub admin_token: String,
    /// Checkpoints load from under this URL only; `None`: reload over HTTP is
    /// off (the engine still follows `forgelog.policy`).
    pub checkpoint_root: Option<Url>,
    /// Larger checkpoints are refused before a byte is read.
    pub max_checkpoint_bytes: u64,
}

/// Policy versions are `long` in the log.
const MAX_VERSION: u64 = i64::MAX as u64;

/// How far past the serving version one reload may jump: a typo of a huge
/// version would make every real later version "not newer" for ever.
pub const MAX_VERSION_STEP: u64 = 1 << 16;

fn error(status: u16, kind: &'static str, message: String) -> ApiError {
    ApiError {
        status,
        message,
        kind,
        code: None,
    }
}

impl ReloadAccess {
    /// `root` as a directory URL (a trailing `/`), so that `…/checkpoints-old`
    /// is not under `…/checkpoints`.
    pub fn root(root: &str) -> Result<Url, url::ParseError> {
        let mut url = Url::parse(root)?;
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        Ok(url)
    }

    pub fn check_token(&self, headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
        if forgelog_http::is_bearer(headers, &self.admin_token) {
            Ok(())
        } else {
            Err(error(
                401,
                "authentication_error",
                "admin token required".into(),
            ))
        }
    }

    /// The checkpoint URL, if it is under the root. A URL outside it gets the
    /// same answer whether or not anything is there (no existence oracle);
    /// `..` is resolved by the URL parser before the comparison.
    pub fn check_uri(&self, uri: &str) -> Result<Url, ApiError> {
        let Some(root) = &self.checkpoint_root else {
            return Err(error(
                403,
                "permission_error",
                "reload over HTTP is off: start the engine with --checkpoint-root \
                 (it follows forgelog.policy with --brokers)"
                    .into(),
            ));
        };
        let outside = || {
            error(
                403,
                "permission_error",
                format!("checkpoints load from under {root} only"),
            )
        };
        let url = Url::parse(uri).map_err(|_| outside())?;
        if url.scheme() != root.scheme()
            || url.host_str() != root.host_str()
            || url.port() != root.port()
            || !url.path().starts_with(root.path())
            || url.query().is_some()
        {
            return Err(outside());
        }
        if url.scheme() == "file" {
            return real_file(url, root).ok_or_else(outside);
        }
        Ok(url)
    }

    /// A version the log can hold and newer than the one serving.
    pub fn check_version(version: u64, serving: u64) -> Result<(), ApiError> {
        if version > MAX_VERSION {
            return Err(ApiError::invalid(format!(
                "version {version} is over {MAX_VERSION}"
            )));
        }
        if version <= serving {
            return Err(error(
                409,
                "conflict_error",
                format!("version {version} is not newer than the serving policy {serving}"),
            ));
        }
        if version - serving > MAX_VERSION_STEP {
            return Err(ApiError::invalid(format!(
                "version {version} is more than {MAX_VERSION_STEP} past the serving policy \
                 {serving}: every later version would be refused as not newer"
            )));
        }
        Ok(())
    }
}

/// A file checkpoint as it really is, symlinks resolved (the file the load
/// reads: `model.safetensors` in a folder URL); `None` if that leaves the
/// root. One not there passes as it is: the load says it is missing.
fn real_file(url: Url, root: &Url) -> Option<Url> {
    let (path, root_path) = (url.to_file_path().ok()?, root.to_file_path().ok()?);
    let file = if url.path().ends_with('/') {
        path.join("model.safetensors")
    } else {
        path
    };
    let Ok(real) = std::fs::canonicalize(&file) else {
        return Some(url);
    };
    let real_root = std::fs::canonicalize(&root_path).unwrap_or(root_path);
    if !real.starts_with(&real_root) {
        return None;
    }
    Url::from_file_path(&real).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(root: &str) -> ReloadAccess {
        ReloadAccess {
            admin_token: "t".into(),
            checkpoint_root: Some(ReloadAccess::root(root).unwrap()),
            max_checkpoint_bytes: 1 << 20,
        }
    }

    #[test]
    fn only_urls_under_the_root_pass() {
        let a = access("file:///srv/checkpoints");
        assert!(a
            .check_uri("file:///srv/checkpoints/run/v3/model.safetensors")
            .is_ok());
        for refused in [
            "file:///etc/shadow",
            "file:///srv/checkpoints/../secrets/model.safetensors",
            "file:///srv/checkpoints/%2e%2e/secrets/model.safetensors",
            "file:///srv/checkpoints-old/model.safetensors",
            "s3://srv/checkpoints/model.safetensors",
            "not a url",
        ] {
            let e = a.check_uri(refused).unwrap_err();
            assert_eq!(e.status, 403, "{refused}");
        }
        let s3 = access("s3://bucket/checkpoints/");
        assert!(s3.check_uri("s3://bucket/checkpoints/r/v1/").is_ok());
        assert!(s3.check_uri("s3://other/checkpoints/r/v1/").is_err());
        let off = ReloadAccess {
            checkpoint_root: None,
            ..a
        };
        assert_eq!(
            off.check_uri("file:///srv/checkpoints/x")
                .unwrap_err()
                .status,
            403
        );
    }

    #[test]
    fn a_symlink_out_of_the_root_is_refused_and_the_real_file_is_loaded() {
        let (root, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let secret = elsewhere.path().join("model.safetensors");
        std::fs::write(&secret, b"not yours").unwrap();
        let real = root.path().join("v1");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("model.safetensors"), b"weights").unwrap();
        // A folder that is a link out, and a real folder whose file is one.
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("v2")).unwrap();
        std::fs::create_dir(root.path().join("v3")).unwrap();
        std::os::unix::fs::symlink(&secret, root.path().join("v3/model.safetensors")).unwrap();
        // A link that stays inside is fine, and resolves.
        std::os::unix::fs::symlink(&real, root.path().join("latest")).unwrap();
        let a = access(&format!("file://{}", root.path().display()));
        let at = |rel: &str| format!("file://{}/{rel}", root.path().display());
        for refused in ["v2/", "v2/model.safetensors", "v3/", "v3/model.safetensors"] {
            assert_eq!(
                a.check_uri(&at(refused)).unwrap_err().status,
                403,
                "{refused}"
            );
        }
        let loaded = a.check_uri(&at("latest/")).unwrap();
        assert_eq!(
            loaded.to_file_path().unwrap(),
            std::fs::canonicalize(real.join("model.safetensors")).unwrap()
        );
        assert!(
            a.check_uri(&at("v9/")).is_ok(),
            "a missing one is the load's to report"
        );
    }

    #[test]
    fn versions_only_move_forward_and_fit_the_log() {
        assert_eq!(
            ReloadAccess::check_version(3 + MAX_VERSION_STEP + 1, 3)
                .unwrap_err()
                .status,
            400
        );
        assert!(ReloadAccess::check_version(3 + MAX_VERSION_STEP, 3).is_ok());
        assert!(ReloadAccess::check_version(4, 3).is_ok());
        assert_eq!(ReloadAccess::check_version(3, 3).unwrap_err().status, 409);
        assert_eq!(
            ReloadAccess::check_version(u64::MAX, 3).unwrap_err().status,
            400
        );
    }
}

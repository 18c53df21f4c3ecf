//! Who may swap the policy over HTTP (`POST /admin/reload`), and from where:
//! the admin token, checkpoints only under one root URL, policy versions only
//! forward, checkpoints of a bounded size. Pure checks; the route applies them.

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
        Ok(())
    }
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
    fn versions_only_move_forward_and_fit_the_log() {
        assert!(ReloadAccess::check_version(4, 3).is_ok());
        assert_eq!(ReloadAccess::check_version(3, 3).unwrap_err().status, 409);
        assert_eq!(
            ReloadAccess::check_version(u64::MAX, 3).unwrap_err().status,
            400
        );
    }
}

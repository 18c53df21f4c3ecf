//! Clocks pinned per attempt (`forgelog run --replay`): libfaketime,
//! preloaded into the harness's processes, starts an attempt's clock at its
//! recorded start, so what a harness writes about "today" into its prompts
//! comes out as it did. Programs that do not read the time through the C
//! library (statically linked ones) keep the real clock; replay's normaliser
//! explains the dates they write.

use super::Mount;
use forgelog_deploy_core::replay::faketime_offset;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where libfaketime is mounted in a sandbox.
const IN_SANDBOX: &str = "/forgelog/faketime";

/// Where Debian and others install libfaketime.
const KNOWN: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

#[derive(Debug, Clone, PartialEq)]
pub struct PinnedClocks {
    /// The library on this host.
    pub libfaketime: PathBuf,
    /// Each attempt's start, in ms since the epoch, by attempt id.
    pub starts: BTreeMap<String, i64>,
}

impl PinnedClocks {
    /// libfaketime on this host: `$FORGELOG_LIBFAKETIME`, else where the
    /// distributions put it.
    pub fn find_libfaketime() -> Option<PathBuf> {
        let named = std::env::var_os("FORGELOG_LIBFAKETIME").map(PathBuf::from);
        named
            .into_iter()
            .chain(KNOWN.iter().map(PathBuf::from))
            .find(|p| p.is_file())
    }

    /// The mount and environment that pin attempt `id`'s clock, if it has
    /// one, for an attempt that starts at `now_ms`.
    pub fn for_attempt(&self, id: &str, now_ms: i64) -> Option<(Mount, Vec<(String, String)>)> {
        let start = *self.starts.get(id)?;
        let dir = self.libfaketime.parent().unwrap_or(Path::new("/"));
        let file = self.libfaketime.file_name()?.to_string_lossy().into_owned();
        let mount = Mount {
            host: dir.to_path_buf(),
            target: IN_SANDBOX.into(),
            read_only: true,
        };
        let env = vec![
            ("LD_PRELOAD".into(), format!("{IN_SANDBOX}/{file}")),
            ("FAKETIME".into(), faketime_offset(start, now_ms)),
            // Timers and timeouts keep real monotonic time (Node's event
            // loop misbehaves otherwise).
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ];
        Some((mount, env))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_with_a_recorded_start_gets_the_library_and_its_clock() {
        let clocks = PinnedClocks {
            libfaketime: "/usr/lib/faketime/libfaketime.so.1".into(),
            starts: [("r-0".to_string(), 1_796_102_989_315)].into(),
        };
        let (mount, env) = clocks.for_attempt("r-0", 1_796_102_999_315).unwrap();
        assert_eq!(mount.host, Path::new("/usr/lib/faketime"));
        assert!(mount.read_only);
        let env: BTreeMap<_, _> = env.into_iter().collect();
        assert_eq!(env["LD_PRELOAD"], "/forgelog/faketime/libfaketime.so.1");
        assert_eq!(env["FAKETIME"], "-10s");
        assert!(clocks.for_attempt("r-1", 0).is_none());
    }
}

//! Where a model runs, as its users name it (`--device cpu|cuda`): one
//! home for the engine, the learner and their benches.

use candle_core::Device;
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    #[default]
    Cpu,
    /// The first CUDA device (a build with `--features cuda`).
    Cuda,
}

impl DeviceKind {
    /// The device itself; on CUDA, an error that says how to get a build
    /// with it when this one has none.
    pub fn open(self) -> Result<Device, String> {
        match self {
            DeviceKind::Cpu => Ok(Device::Cpu),
            DeviceKind::Cuda => Device::new_cuda(0)
                .map_err(|e| format!("{e} (build with `--features cuda` for GPU support)")),
        }
    }
}

impl FromStr for DeviceKind {
    type Err = String;

    fn from_str(s: &str) -> Result<DeviceKind, String> {
        match s {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" => Ok(DeviceKind::Cuda),
            other => Err(format!("unknown device {other:?}: cpu or cuda")),
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_named_as_users_write_them() {
        for kind in [DeviceKind::Cpu, DeviceKind::Cuda] {
            assert_eq!(kind.to_string().parse::<DeviceKind>(), Ok(kind));
        }
        let err = "gpu".parse::<DeviceKind>().unwrap_err();
        assert!(
            err.contains("\"gpu\"") && err.contains("cpu or cuda"),
            "{err}"
        );
    }
}

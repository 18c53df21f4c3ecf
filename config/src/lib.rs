//! forgelog-config: `forgelog.toml`, defaults for `train`, `run` and `up`,
//! one table each, keyed by option name (`learning-rate` or `learning_rate`).
//! A flag on the command line wins, then its environment variable, then the
//! file, then the built-in default: the file's values become the options'
//! defaults. The command is the caller's: any clap command whose
//! subcommands are named as the tables are.
//!
//! ```toml
//! [run]
//! harness = ["claude-code", "codex"]
//! group-size = 8
//! train = true
//!
//! [train]
//! learning-rate = 1e-6
//! ```

pub mod value;

use std::path::{Path, PathBuf};

/// The subcommands a file may configure.
pub const SECTIONS: [&str; 3] = ["train", "run", "up"];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {why}")]
    Unreadable { path: PathBuf, why: String },
    #[error("{path}: [{section}] has no option `{key}` (see `forgelog {section} --help`)")]
    UnknownOption {
        path: PathBuf,
        section: String,
        key: String,
    },
    #[error("{path}: `{key}` in [{section}] must be a string, number, boolean or a list of them")]
    BadValue {
        path: PathBuf,
        section: String,
        key: String,
    },
    #[error("{path}: unknown table [{section}]; forgelog.toml configures [train], [run] and [up]")]
    UnknownSection { path: PathBuf, section: String },
}

/// Where the file is: `--config PATH` or `FORGELOG_CONFIG` when given (then it
/// must exist), else `./forgelog.toml` when there is one.
pub fn locate(args: &[String]) -> Option<(PathBuf, bool)> {
    let given = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix("--config=").map(String::from))
        })
        .or_else(|| std::env::var("FORGELOG_CONFIG").ok());
    match given {
        Some(path) => Some((PathBuf::from(path), true)),
        None => {
            let local = PathBuf::from("forgelog.toml");
            local.is_file().then_some((local, false))
        }
    }
}

/// `command` with the file's values as its subcommands' defaults.
pub fn apply(command: clap::Command, path: &Path) -> Result<clap::Command, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Unreadable {
        path: path.into(),
        why: e.to_string(),
    })?;
    let table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Unreadable {
                path: path.into(),
                why: e.to_string(),
            })?;
    let mut command = command;
    for (section, values) in table {
        if !SECTIONS.contains(&section.as_str()) {
            return Err(ConfigError::UnknownSection {
                path: path.into(),
                section,
            });
        }
        let Some(values) = values.as_table() else {
            return Err(ConfigError::UnknownSection {
                path: path.into(),
                section,
            });
        };
        for (key, value) in values {
            let sub = command
                .find_subcommand(&section)
                .expect("every section is a subcommand");
            let long = key.replace('_', "-");
            // Options by their long name; a positional by its name (`tasks`).
            let Some(id) = sub
                .get_arguments()
                .find(|a| {
                    a.get_long() == Some(long.as_str())
                        || (a.is_positional() && a.get_id().as_str() == key.replace('-', "_"))
                })
                .map(|a| a.get_id().clone())
            else {
                return Err(ConfigError::UnknownOption {
                    path: path.into(),
                    section,
                    key: key.clone(),
                });
            };
            let bad = || ConfigError::BadValue {
                path: path.into(),
                section: section.clone(),
                key: key.clone(),
            };
            let values: Vec<String> = match value {
                toml::Value::Array(items) => items.iter().map(scalar).collect::<Option<_>>(),
                one => scalar(one).map(|v| vec![v]),
            }
            .ok_or_else(bad)?;
            command = command.mut_subcommand(&section, |sub| {
                sub.mut_arg(id, |arg| arg.default_values(values).required(false))
            });
        }
    }
    Ok(command)
}

fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn cli() -> Command {
        Command::new("forgelog")
            .subcommand(
                Command::new("train")
                    .arg(
                        Arg::new("learning_rate")
                            .long("learning-rate")
                            .default_value("0.00001"),
                    )
                    .arg(Arg::new("kl").long("kl"))
                    .arg(
                        Arg::new("brokers")
                            .long("brokers")
                            .env("FORGELOG_TEST_BROKERS"),
                    )
                    .arg(Arg::new("resume").long("resume").action(ArgAction::SetTrue))
                    .arg(
                        Arg::new("harness")
                            .long("harness")
                            .value_delimiter(',')
                            .num_args(1..),
                    ),
            )
            .subcommand(Command::new("run").arg(Arg::new("tasks").required(true)))
            .subcommand(Command::new("up"))
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn train(cfg: &str, args: &[&str]) -> clap::ArgMatches {
        let f = file(cfg);
        let m = apply(cli(), f.path())
            .unwrap()
            .get_matches_from([&["forgelog", "train"][..], args].concat());
        m.subcommand_matches("train").unwrap().clone()
    }

    #[test]
    fn the_file_sets_defaults_and_a_flag_still_wins() {
        let cfg =
            "[train]\nlearning-rate = 3e-6\nresume = true\nharness = [\"codex\", \"aider\"]\n";
        let m = train(cfg, &[]);
        assert_eq!(m.get_one::<String>("learning_rate").unwrap(), "0.000003");
        assert!(m.get_flag("resume"));
        let harnesses: Vec<&String> = m.get_many("harness").unwrap().collect();
        assert_eq!(harnesses, ["codex", "aider"]);
        let m = train(cfg, &["--learning-rate", "0.5"]);
        assert_eq!(m.get_one::<String>("learning_rate").unwrap(), "0.5");
        // Unset in the file: the built-in default.
        assert_eq!(
            train("", &[]).get_one::<String>("learning_rate").unwrap(),
            "0.00001"
        );
        // snake_case keys too, and a required positional the file provides.
        let f = file("[train]\nlearning_rate = 1\n[run]\ntasks = \"deploy/tasks\"\n");
        let m = apply(cli(), f.path())
            .unwrap()
            .get_matches_from(["forgelog", "run"]);
        assert_eq!(
            m.subcommand_matches("run")
                .unwrap()
                .get_one::<String>("tasks")
                .unwrap(),
            "deploy/tasks"
        );
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        std::env::set_var("FORGELOG_TEST_BROKERS", "from-env:9092");
        let m = train("[train]\nbrokers = \"from-file:9092\"\n", &[]);
        std::env::remove_var("FORGELOG_TEST_BROKERS");
        assert_eq!(m.get_one::<String>("brokers").unwrap(), "from-env:9092");
    }

    #[test]
    fn mistakes_in_the_file_are_named() {
        let err = |text: &str| apply(cli(), file(text).path()).unwrap_err().to_string();
        assert!(err("[train]\nlearning-rat = 1\n").contains("[train] has no option `learning-rat`"));
        assert!(err("[serve]\nx = 1\n").contains("unknown table [serve]"));
        assert!(err("[train]\nkl = { a = 1 }\n").contains("`kl` in [train] must be"));
        assert!(err("[train\n").contains("TOML") || err("[train\n").contains("expected"));
    }
}

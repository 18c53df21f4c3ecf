//! Parsers of the learner's numeric flags (`train`'s, and those `up` and
//! `run` pass on): a value it cannot train with is refused where it is
//! parsed, naming the flag. Found by probing `forgelog train`:
//! `--learning-rate nan` trained, `--tokens-per-step 0` published an empty
//! version every second (a full checkpoint each), `--idle-flush nan` and
//! `--publish-every 0` panicked, `--temperature 0` divided the logits by 0.

/// A finite number above 0.
pub fn above_zero(value: &str) -> Result<f64, String> {
    match finite(value)? {
        x if x > 0.0 => Ok(x),
        _ => Err("must be above 0".into()),
    }
}

/// A finite number, 0 or more.
pub fn zero_or_more(value: &str) -> Result<f64, String> {
    match finite(value)? {
        x if x >= 0.0 => Ok(x),
        _ => Err("must be 0 or more".into()),
    }
}

/// A count, 1 or more.
pub fn one_or_more(value: &str) -> Result<usize, String> {
    match value.parse::<usize>().map_err(|e| e.to_string())? {
        0 => Err("must be 1 or more".into()),
        n => Ok(n),
    }
}

fn finite(value: &str) -> Result<f64, String> {
    match value.parse::<f64>().map_err(|e| e.to_string())? {
        x if x.is_finite() => Ok(x),
        _ => Err("must be a finite number".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    fn parsed(flags: &[&str]) -> Result<crate::TrainArgs, String> {
        let command = crate::TrainArgs::augment_args(clap::Command::new("train"));
        let args = std::iter::once("train").chain(flags.iter().copied());
        let matches = command
            .try_get_matches_from(args)
            .map_err(|e| e.to_string())?;
        crate::TrainArgs::from_arg_matches(&matches).map_err(|e| e.to_string())
    }

    #[test]
    fn values_the_learner_cannot_train_with_are_refused_naming_the_flag() {
        let refused = [
            ("--learning-rate", "nan", "must be a finite number"),
            ("--learning-rate", "-1e-6", "must be above 0"),
            ("--learning-rate", "0", "must be above 0"),
            ("--temperature", "0", "must be above 0"),
            ("--is-cap", "inf", "must be a finite number"),
            ("--max-grad-norm", "0", "must be above 0"),
            ("--weight-decay", "-0.1", "must be 0 or more"),
            ("--kl", "nan", "must be a finite number"),
            ("--lora-alpha", "0", "must be above 0"),
            ("--idle-flush", "nan", "must be a finite number"),
            ("--idle-flush", "-1", "must be 0 or more"),
            ("--tokens-per-step", "0", "must be 1 or more"),
            ("--micro-batch-tokens", "0", "must be 1 or more"),
            ("--groups-per-step", "0", "must be 1 or more"),
            ("--publish-every", "0", "0 is not in 1.."),
            ("--keep-versions", "0", "0 is not in 1.."),
        ];
        for (flag, value, why) in refused {
            let err = parsed(&[&format!("{flag}={value}")]).unwrap_err();
            assert!(
                err.contains(&format!("invalid value '{value}' for '{flag} <"))
                    && err.contains(why),
                "{flag} {value}: {err}"
            );
        }
        let args = parsed(&["--weight-decay", "0", "--kl", "0", "--idle-flush", "0"]).unwrap();
        assert_eq!(
            (args.weight_decay, args.kl, args.idle_flush),
            (0.0, Some(0.0), 0.0)
        );
        assert_eq!(one_or_more("12"), Ok(12));
        assert_eq!(above_zero("1e-6"), Ok(1e-6));
    }
}

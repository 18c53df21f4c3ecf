//! Parsers of option values that only some numbers make sense for, shared
//! by every command's flags (a learner's rate, a proxy's limits): the value
//! is refused where it is parsed, naming the flag, by command line,
//! variable or `forgelog.toml`. Found by probing: `train --learning-rate nan`
//! trained, `--tokens-per-step 0` published an empty version every second
//! (a full checkpoint each), `--idle-flush nan` and `--publish-every 0`
//! panicked, `--temperature 0` divided the logits by 0, `proxy
//! --upstream-timeout-secs 0` failed every call at once (504), and counts
//! of 0 (`run --concurrency`, the proxy's limits) were taken as 1 unsaid.

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

    #[test]
    fn only_the_numbers_meant_pass() {
        assert_eq!(above_zero("1e-6"), Ok(1e-6));
        assert_eq!(zero_or_more("0"), Ok(0.0));
        assert_eq!(one_or_more("12"), Ok(12));
        for bad in ["0", "-1", "nan", "inf", "x"] {
            assert!(above_zero(bad).is_err(), "{bad}");
        }
        assert_eq!(zero_or_more("-0.5"), Err("must be 0 or more".into()));
        assert_eq!(zero_or_more("NaN"), Err("must be a finite number".into()));
        assert_eq!(one_or_more("0"), Err("must be 1 or more".into()));
        assert!(one_or_more("-3").is_err());
    }
}

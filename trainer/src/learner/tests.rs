use super::StepMetrics;

/// A step that trained no token used to publish importance ratios of 0.
#[test]
fn a_step_without_tokens_publishes_no_ratios() {
    let empty = StepMetrics {
        groups: 2,
        ..Default::default()
    }
    .to_map();
    for k in [
        "is_ratio_mean",
        "is_ratio_min",
        "is_ratio_max",
        "truncated_fraction",
        "entropy",
    ] {
        assert!(!empty.contains_key(k), "{k}");
    }
    assert_eq!(empty["tokens"], 0.0);
    let trained = StepMetrics {
        tokens: 5,
        ratio_mean: 1.0,
        ratio_min: 0.9,
        ratio_max: 1.1,
        ..Default::default()
    }
    .to_map();
    assert_eq!(
        (trained["is_ratio_min"], trained["is_ratio_max"]),
        (0.9, 1.1)
    );
}

mod samples;

use forgelog_schemas::*;
use proptest::prelude::*;

fn codec() -> &'static Codec {
    Codec::global()
}

#[test]
fn every_kind_has_a_sample_and_round_trips() {
    let samples = samples::all();
    let kinds: Vec<_> = samples.iter().map(Event::kind).collect();
    assert_eq!(kinds, EventKind::ALL);
    for e in samples {
        let bytes = codec().encode(&e).unwrap();
        assert_eq!(&bytes[..2], &[0xC3, 0x01]);
        assert_eq!(codec().peek_kind(&bytes).unwrap(), e.kind());
        assert_eq!(codec().decode(&bytes).unwrap(), e);
    }
}

/// `tests/fixtures/vN` holds events written by each schema version (committed
/// bytes, never rewritten once released).
/// Events written by every schema version still decode into today's types (v1
/// CallFinished lacks `unparsed_tool_calls`: it reads as 0, as in the samples).
/// `cargo run -p forgelog-schemas --example write-fixtures -- vN` writes a new
/// version's files, once, when it is released.
#[test]
fn fixtures_of_every_schema_version_decode_with_current_schemas() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for version in ["v1", "v2", "v3", "v4", "v5", "v6", "v7"] {
        let dir = root.join(version);
        for e in samples::all() {
            let path = dir.join(format!("{}.avro", e.kind().name()));
            // Kinds newer than the version have no file in it.
            if e.kind() == EventKind::DeadLetter && version < "v4" {
                assert!(!path.exists());
                continue;
            }
            let bytes =
                std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            assert_eq!(codec().decode(&bytes).unwrap(), e, "{}", path.display());
            assert_eq!(codec().peek_run_id(&bytes), Some(e.run_id()));
        }
    }
    // The versions differ where the schema did: v1's CallFinished carries its own fingerprint.
    let v1 = std::fs::read(root.join("v1/CallFinished.avro")).unwrap();
    let v2 = std::fs::read(root.join("v2/CallFinished.avro")).unwrap();
    assert_ne!(v1[2..10], v2[2..10]);
    assert_eq!(v2.len(), v1.len() + 1, "one zig-zag 0 more");
    // v3 adds VerifierResult.abandoned (older verdicts read it as false).
    let v2 = std::fs::read(root.join("v2/VerifierResult.avro")).unwrap();
    let v3 = std::fs::read(root.join("v3/VerifierResult.avro")).unwrap();
    assert_ne!(v2[2..10], v3[2..10]);
    assert_eq!(v3.len(), v2.len() + 1, "one boolean more");
    // v4 adds RolloutStarted.max_model_calls, max_tokens and api_key_sha256
    // (older ones read them as null).
    let v3 = std::fs::read(root.join("v3/RolloutStarted.avro")).unwrap();
    let v4 = std::fs::read(root.join("v4/RolloutStarted.avro")).unwrap();
    assert_ne!(v3[2..10], v4[2..10]);
    assert_eq!(v4.len(), v3.len() + 3, "three union indices more");
    // v5 stores calls relative to earlier ones: CallStarted.raw_request_splice,
    // CallFinished.prompt_splice and chat_request_splice (older ones read null: whole).
    for (kind, more) in [("CallStarted", 1), ("CallFinished", 2)] {
        let v4 = std::fs::read(root.join(format!("v4/{kind}.avro"))).unwrap();
        let v5 = std::fs::read(root.join(format!("v5/{kind}.avro"))).unwrap();
        assert_ne!(v4[2..10], v5[2..10], "{kind}");
        assert_eq!(v5.len(), v4.len() + more, "{kind}: union indices more");
    }
    // v6 adds CallFinished.prompt_made (older calls read null: the engine rendered them).
    let v5 = std::fs::read(root.join("v5/CallFinished.avro")).unwrap();
    let v6 = std::fs::read(root.join("v6/CallFinished.avro")).unwrap();
    assert_ne!(v5[2..10], v6[2..10]);
    assert_eq!(v6.len(), v5.len() + 1, "one union index more");
    // v7 adds CallFinished.stand_in (older calls read null: their own events).
    let v7 = std::fs::read(root.join("v7/CallFinished.avro")).unwrap();
    assert_ne!(v6[2..10], v7[2..10]);
    assert_eq!(v7.len(), v6.len() + 1, "one union index more");
}

/// A run id is read from an event's first bytes only when they are an event's:
/// anything else gives `None` (the reader then decodes, and reports it).
#[test]
fn the_run_is_peeked_only_from_a_known_event() {
    let e = &samples::all()[0];
    let bytes = codec().encode(e).unwrap();
    assert_eq!(codec().peek_run_id(&bytes), Some(e.run_id()));
    let mut unknown = bytes.clone();
    unknown[2] ^= 0xFF;
    let len = e.run_id().len();
    for bad in [
        &unknown[..],
        &bytes[..10],           // no body
        &bytes[..10 + len],     // the run id cut short (1 byte of length)
        &bytes[1..],            // no header
        b"{\"run_id\": \"r\"}", // not Avro at all
    ] {
        assert_eq!(codec().peek_run_id(bad), None, "{bad:?}");
    }
    // A length past the end, or negative, is not a run id either.
    let mut long = bytes[..10].to_vec();
    long.extend([0xFE, 0xFF, 0xFF, 0xFF, 0x0F]);
    assert_eq!(codec().peek_run_id(&long), None);
    let mut negative = bytes[..10].to_vec();
    negative.push(0x01);
    assert_eq!(codec().peek_run_id(&negative), None);
}

/// Readers skip other runs by the first field: a schema without `run_id`
/// first is refused when the codec is built, not found out in a reader.
#[test]
#[should_panic(expected = "must start with `run_id`")]
fn a_schema_not_starting_with_run_id_is_refused() {
    let avsc = r#"{"type": "record", "name": "CallStarted", "namespace": "forgelog.v1",
        "fields": [{"name": "event_id", "type": "string"}, {"name": "run_id", "type": "string"}]}"#;
    Codec::with_history(&[(EventKind::CallStarted, "v0", avsc)]);
}

#[test]
fn unknown_fingerprint_and_garbage_are_clear_errors() {
    let mut bytes = codec().encode(&samples::all()[0]).unwrap();
    bytes[2] ^= 0xFF;
    let err = codec().decode(&bytes).unwrap_err();
    assert!(matches!(err, DecodeError::UnknownFingerprint(_)));
    assert!(
        err.to_string().contains("unknown schema fingerprint"),
        "{err}"
    );

    let err = codec().decode(b"{\"json\": true}").unwrap_err();
    assert!(err.to_string().contains("C3 01"), "{err}");

    let good = codec().encode(&samples::all()[1]).unwrap();
    let err = codec().decode(&good[..good.len() - 5]).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Body {
                kind: "CallFinished",
                ..
            }
        ),
        "{err}"
    );
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(
        codec().decode(&long).unwrap_err(),
        DecodeError::TrailingBytes { len: 1, .. }
    ));
}

#[test]
fn packed_tokens_are_compact() {
    // 100k prompt tokens + 8k sampled tokens with logprobs: 4 bytes per number plus a small envelope.
    let Event::CallFinished(mut call) = samples::all().remove(1) else {
        unreachable!()
    };
    call.prompt_token_ids = (0..100_000).map(|i| i % 49_152).collect();
    call.completion_token_ids = (0..8_000).collect();
    call.completion_logprobs = (0..8_000).map(|i| -(i as f32) / 1000.0).collect();
    let event: Event = call.into();
    let bytes = codec().encode(&event).unwrap();
    let payload = 4 * (100_000 + 8_000 + 8_000);
    assert!(
        bytes.len() < payload + 1024,
        "{} bytes for {payload} bytes of numbers",
        bytes.len()
    );
    assert_eq!(codec().decode(&bytes).unwrap(), event);
}

#[test]
fn json_shows_numbers_not_bytes() {
    let json = serde_json::to_value(&samples::all()[1]).unwrap();
    assert_eq!(json["type"], "CallFinished");
    assert_eq!(json["completion_token_ids"], serde_json::json!([42, 43]));
    let back: Event = serde_json::from_value(json).unwrap();
    assert_eq!(back, samples::all()[1]);
}

fn text() -> impl Strategy<Value = String> {
    "[a-z0-9\\-é✓]{0,12}"
}

fn opt<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<T>> {
    prop::option::of(s)
}

fn finite() -> impl Strategy<Value = f64> {
    -1e6f64..1e6
}

fn sampling() -> impl Strategy<Value = SamplingParams> {
    (
        opt(finite()),
        opt(finite()),
        opt(any::<i64>()),
        opt(finite()),
        opt(any::<i64>()),
        opt(any::<i64>()),
        opt(finite()),
        opt(finite()),
        prop::collection::vec(text(), 0..3),
    )
        .prop_map(
            |(
                temperature,
                top_p,
                top_k,
                min_p,
                max_tokens,
                seed,
                presence_penalty,
                frequency_penalty,
                stop,
            )| SamplingParams {
                temperature,
                top_p,
                top_k,
                min_p,
                max_tokens,
                seed,
                presence_penalty,
                frequency_penalty,
                stop,
            },
        )
}

fn logprobs(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-50f32..=0.0, n)
}

fn sequence() -> impl Strategy<Value = Sequence> {
    (0usize..40).prop_flat_map(|n| {
        (
            any::<i64>(),
            prop::collection::vec(any::<i64>(), 0..4),
            any::<bool>(),
            prop::collection::vec(any::<u32>(), n),
            prop::collection::vec(0u8..=1, n),
            logprobs(n..n + 1),
            prop::collection::vec(any::<u32>(), n),
            any::<i64>(),
        )
            .prop_map(
                |(
                    root,
                    call_indices,
                    discarded,
                    token_ids,
                    loss_mask,
                    sampling_logprobs,
                    policy_versions,
                    tool_calls,
                )| Sequence {
                    root,
                    call_indices,
                    discarded,
                    token_ids,
                    loss_mask,
                    sampling_logprobs,
                    policy_versions,
                    tool_calls,
                },
            )
    })
}

fn dialect() -> impl Strategy<Value = Dialect> {
    prop_oneof![
        Just(Dialect::OpenaiChat),
        Just(Dialect::OpenaiResponses),
        Just(Dialect::AnthropicMessages),
        Just(Dialect::Gemini)
    ]
}

fn status() -> impl Strategy<Value = CallStatus> {
    prop_oneof![
        Just(CallStatus::Ok),
        Just(CallStatus::ClientError),
        Just(CallStatus::UpstreamError),
        Just(CallStatus::BudgetStop)
    ]
}

fn prompt_made() -> impl Strategy<Value = PromptMade> {
    (opt(any::<i64>()), opt(text()), text(), text()).prop_map(
        |(spliced_from, why_rendered, tokenizer_sha256, chat_template_sha256)| PromptMade {
            spliced_from,
            why_rendered,
            tokenizer_sha256,
            chat_template_sha256,
        },
    )
}

fn splice() -> impl Strategy<Value = compact::Splice> {
    any::<(i64, i64, i64)>().prop_map(|(base_call, prefix, suffix)| compact::Splice {
        base_call,
        prefix,
        suffix,
    })
}

fn ids() -> (
    impl Strategy<Value = String>,
    impl Strategy<Value = String>,
    impl Strategy<Value = String>,
    impl Strategy<Value = String>,
) {
    (text(), text(), text(), text())
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (
            ids(),
            any::<i64>(),
            dialect(),
            text(),
            prop::collection::vec(any::<u8>(), 0..64),
            any::<i64>(),
            opt(splice())
        )
            .prop_map(
                |(
                    (run_id, event_id, session_id, rollout_id),
                    call_index,
                    dialect,
                    harness,
                    raw_request,
                    received_at_ms,
                    raw_request_splice,
                )| {
                    CallStarted {
                        run_id,
                        event_id,
                        session_id,
                        rollout_id,
                        call_index,
                        dialect,
                        harness,
                        path: "/v1/x".into(),
                        raw_request,
                        received_at_ms,
                        raw_request_splice,
                    }
                    .into()
                }
            ),
        (
            ids(),
            status(),
            opt(text()),
            prop::collection::vec(any::<u32>(), 0..300),
            (0usize..50)
                .prop_flat_map(|n| (prop::collection::vec(any::<u32>(), n), logprobs(n..n + 1))),
            (
                sampling(),
                sampling(),
                opt(any::<i64>()),
                any::<bool>(),
                opt(text()),
                any::<(i64, i64, i64, i64)>()
            ),
            (
                opt(splice()),
                opt(splice()),
                opt(prompt_made()),
                opt(text())
            )
        )
            .prop_map(
                |(
                    (run_id, event_id, session_id, rollout_id),
                    status,
                    error,
                    prompt_token_ids,
                    (completion_token_ids, completion_logprobs),
                    (
                        sampling_requested,
                        sampling_sent,
                        policy_version,
                        trainable,
                        untrainable_reason,
                        (latency_ms, finished_at_ms, call_index, unparsed_tool_calls),
                    ),
                    (prompt_splice, chat_request_splice, prompt_made, stand_in),
                )| {
                    CallFinished {
                        run_id,
                        event_id,
                        session_id,
                        rollout_id,
                        call_index,
                        status,
                        error,
                        model: "m".into(),
                        usage: Usage {
                            prompt_tokens: prompt_token_ids.len() as i64,
                            completion_tokens: completion_token_ids.len() as i64,
                        },
                        prompt_token_ids,
                        completion_token_ids,
                        completion_logprobs,
                        finish_reason: Some("length".into()),
                        sampling_requested,
                        sampling_sent,
                        policy_version,
                        trainable,
                        untrainable_reason,
                        response_body: b"{}".to_vec(),
                        chat_request: String::new(),
                        chat_response: "{}".into(),
                        latency_ms,
                        finished_at_ms,
                        unparsed_tool_calls,
                        prompt_splice,
                        chat_request_splice,
                        prompt_made,
                        stand_in,
                    }
                    .into()
                }
            ),
        (ids(), text(), text(), opt(any::<i64>()), any::<i64>()).prop_map(
            |(
                (run_id, event_id, rollout_id, session_id),
                task_id,
                group_id,
                policy_version,
                started_at_ms,
            )| {
                RolloutStarted {
                    run_id,
                    event_id,
                    rollout_id,
                    session_id,
                    task_id,
                    harness: "h".into(),
                    group_id,
                    group_size: 8,
                    policy_version,
                    started_at_ms,
                    max_model_calls: None,
                    max_tokens: None,
                    api_key_sha256: None,
                }
                .into()
            }
        ),
        (ids(), opt(any::<i64>()), any::<(i64, i64, i64)>()).prop_map(
            |(
                (run_id, event_id, rollout_id, session_id),
                exit_status,
                (model_calls, started_at_ms, finished_at_ms),
            )| {
                RolloutFinished {
                    run_id,
                    event_id,
                    rollout_id,
                    session_id,
                    exit_status,
                    model_calls,
                    started_at_ms,
                    finished_at_ms,
                }
                .into()
            }
        ),
        (ids(), any::<bool>(), opt(finite()), text(), any::<bool>()).prop_map(
            |((run_id, event_id, rollout_id, _), ok, reward, details, abandoned)| {
                VerifierResult {
                    run_id,
                    event_id,
                    rollout_id,
                    ok,
                    reward,
                    details,
                    abandoned,
                }
                .into()
            }
        ),
        (
            ids(),
            prop::collection::vec(sequence(), 0..4),
            any::<i64>(),
            prop::collection::vec((any::<i64>(), text()), 0..3)
        )
            .prop_map(
                |((run_id, event_id, rollout_id, session_id), sequences, calls, findings)| {
                    let findings = findings
                        .into_iter()
                        .map(|(call_index, detail)| Finding {
                            kind: FindingKind::NotTrainable,
                            call_index,
                            detail,
                        })
                        .collect();
                    TrajectoryBuilt {
                        run_id,
                        event_id,
                        rollout_id,
                        session_id,
                        task_id: "t".into(),
                        group_id: "g".into(),
                        harness: "h".into(),
                        calls,
                        tool_calls: calls / 2,
                        sequences,
                        findings,
                    }
                    .into()
                }
            ),
        (
            ids(),
            any::<bool>(),
            prop::collection::vec(
                (
                    text(),
                    opt(finite()),
                    opt(finite()),
                    prop::collection::vec(sequence(), 0..3)
                ),
                0..4
            )
        )
            .prop_map(
                |((run_id, event_id, group_id, task_id), no_reward_variance, members)| {
                    let members = members
                        .into_iter()
                        .map(|(rollout_id, reward, advantage, sequences)| GroupMember {
                            rollout_id,
                            harness: "h".into(),
                            reward,
                            advantage,
                            sequences,
                        })
                        .collect();
                    TrainingBatch {
                        run_id,
                        event_id,
                        group_id,
                        task_id,
                        no_reward_variance,
                        members,
                    }
                    .into()
                }
            ),
        (
            ids(),
            any::<(i64, i64)>(),
            prop::collection::btree_map(text(), finite(), 0..5)
        )
            .prop_map(
                |((run_id, event_id, checkpoint_uri, _), (version, step), metrics)| {
                    PolicyPublished {
                        run_id,
                        event_id,
                        version,
                        step,
                        checkpoint_uri,
                        metrics,
                    }
                    .into()
                }
            ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_event_round_trips(e in event()) {
        let bytes = codec().encode(&e).unwrap();
        prop_assert_eq!(codec().peek_run_id(&bytes), Some(e.run_id()));
        prop_assert_eq!(codec().decode(&bytes).unwrap(), e);
    }

    /// The codec's own datum writer writes what `apache_avro`'s does, but for
    /// the order of a map's entries: by key here, in `HashMap` order there.
    #[test]
    fn any_event_is_written_as_apache_avro_writes_it(e in event()) {
        let ours = codec().encode(&e).unwrap();
        let theirs = forgelog_schemas::testing::apache_avro_datum(&e);
        if ours[10..] != theirs[..] {
            let Event::PolicyPublished(p) = &e else {
                return Err(TestCaseError::fail(format!("{e:?}: {ours:?} != {theirs:?}")));
            };
            prop_assert!(p.metrics.len() > 1);
            prop_assert_eq!(ours.len() - 10, theirs.len());
            let theirs = [&ours[..10], &theirs[..]].concat();
            prop_assert_eq!(codec().decode(&theirs).unwrap(), e.clone());
        }
        prop_assert_eq!(codec().encode(&e).unwrap(), ours);
    }

    /// The decoder fuzzed: a known fingerprint followed by any bytes, and
    /// valid events with bytes overwritten, are decoded or refused, never a
    /// panic (nor an allocation a corrupt length could make unbounded).
    #[test]
    fn any_body_after_a_known_fingerprint_never_panics(
        e in event(),
        body in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut bytes = codec().encode(&e).unwrap();
        bytes.truncate(10);
        bytes.extend(body);
        let _ = codec().decode(&bytes);
    }

    #[test]
    fn overwritten_bytes_never_panic(
        e in event(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = codec().encode(&e).unwrap();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        let _ = codec().decode(&bytes);
    }

    #[test]
    fn truncated_events_never_panic(e in event(), cut in 0usize..200) {
        let bytes = codec().encode(&e).unwrap();
        let cut = cut.min(bytes.len());
        // Either an error or (if the cut fell at the end) the same event: never a panic.
        if let Ok(back) = codec().decode(&bytes[..bytes.len() - cut]) {
            prop_assert_eq!(back, e);
        }
    }
}

/// An event written by an older schema (without `details`) decodes into today's
/// type with the field's default, through schema resolution.
#[test]
fn older_schema_versions_resolve_to_current_types() {
    let v0 = r#"{"type": "record", "name": "VerifierResult", "namespace": "forgelog", "fields": [
        {"name": "run_id", "type": "string"}, {"name": "event_id", "type": "string"},
        {"name": "rollout_id", "type": "string"}, {"name": "ok", "type": "boolean"},
        {"name": "reward", "type": ["null", "double"], "default": null}]}"#;
    let schema = apache_avro::Schema::parse_str(v0).unwrap();
    let fp = schema.fingerprint::<apache_avro::rabin::Rabin>().bytes;
    use apache_avro::types::Value;
    let record = Value::Record(vec![
        ("run_id".into(), Value::String("run".into())),
        ("event_id".into(), Value::String("e".into())),
        ("rollout_id".into(), Value::String("r".into())),
        ("ok".into(), Value::Boolean(false)),
        ("reward".into(), Value::Union(0, Box::new(Value::Null))),
    ]);
    let mut bytes = vec![0xC3, 0x01];
    bytes.extend_from_slice(&fp);
    bytes.extend(apache_avro::to_avro_datum(&schema, record).unwrap());

    assert!(matches!(
        codec().decode(&bytes),
        Err(DecodeError::UnknownFingerprint(_))
    ));
    let with_v0 = Codec::with_history(&[(EventKind::VerifierResult, "v0", v0)]);
    let expected = VerifierResult {
        run_id: "run".into(),
        event_id: "e".into(),
        rollout_id: "r".into(),
        ok: false,
        reward: None,
        details: String::new(),
        abandoned: false,
    };
    assert_eq!(
        with_v0.decode(&bytes).unwrap(),
        Event::VerifierResult(expected)
    );
}

/// The header carries the specification's fingerprint (checked against
/// fastavro in the root package's `python_reader` test); it differs from the
/// one forgelog wrote before only where a schema has a logical type, and
/// events with the old one still decode.
#[test]
fn events_carry_the_specifications_fingerprint_and_old_ones_still_decode() {
    for f in schema_files() {
        if !f.kind.avsc().contains("logicalType") && !f.file.starts_with("history") {
            // The same CRC-64-AVRO over the same canonical form.
            assert_eq!(f.fingerprint, f.legacy_fingerprint, "{}", f.file);
        }
    }
    for e in samples::all() {
        let bytes = codec().encode(&e).unwrap();
        let (schema, _) = codec().schema(e.kind());
        assert_eq!(bytes[2..10], fingerprint(schema), "{:?}", e.kind());
        let mut old = bytes.clone();
        old[2..10].copy_from_slice(&legacy_fingerprint(schema));
        assert_eq!(codec().decode(&old).unwrap(), e);
    }
    let (started, _) = codec().schema(EventKind::CallStarted);
    assert_ne!(fingerprint(started), legacy_fingerprint(started));
}

/// `avro/legacy-fingerprints.json` (what non-Rust readers use to find events
/// recorded before the specification's fingerprints) lists every schema whose
/// old fingerprint differs. `FORGELOG_WRITE_FIXTURES=1` rewrites it.
#[test]
fn the_legacy_fingerprint_table_is_complete() {
    let table: std::collections::BTreeMap<String, String> = schema_files()
        .into_iter()
        .filter(|f| f.fingerprint != f.legacy_fingerprint)
        .map(|f| (forgelog_schemas::hex(&f.legacy_fingerprint), f.file))
        .collect();
    let want = serde_json::to_string_pretty(&table).unwrap() + "\n";
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("avro/legacy-fingerprints.json");
    if std::env::var_os("FORGELOG_WRITE_FIXTURES").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        have,
        want,
        "{} is stale: FORGELOG_WRITE_FIXTURES=1 rewrites it",
        path.display()
    );
}

#[test]
fn the_schema_version_is_one_past_the_newest_in_history() {
    let newest = forgelog_schemas::HISTORY
        .iter()
        .map(|(_, v, _)| v.trim_start_matches('v').parse::<u32>().unwrap())
        .max()
        .unwrap();
    assert_eq!(forgelog_schemas::SCHEMA_VERSION, newest + 1);
}

/// A body cut just before a trailing optional field is refused: apache-avro
/// reads a nullable union it finds no bytes for as null, so without the
/// codec's check the event decoded with the field lost (found by
/// `truncated_events_never_panic` once `CallFinished` ended with one, v6;
/// `stand_in` is its last since v7).
#[test]
fn a_body_cut_before_a_trailing_optional_field_is_refused() {
    let mut call = samples::all()
        .into_iter()
        .find_map(|e| match e {
            Event::CallFinished(c) => Some(c),
            _ => None,
        })
        .unwrap();
    call.stand_in = None;
    let without = codec().encode(&call.clone().into()).unwrap();
    call.stand_in = Some("refused".into());
    let with = codec().encode(&call.into()).unwrap();
    // Cut before the union's index: every field before it is whole.
    match codec().decode(&with[..without.len() - 1]) {
        Err(DecodeError::Truncated { kind }) => assert_eq!(kind, "CallFinished"),
        other => panic!("{other:?}"),
    }
}

/// A call the log refused is stood in for by its tokens, the same bytes every
/// time (a producer that crashed and retries sends what recovery can match);
/// other kinds have no stand-in.
#[test]
fn a_refused_call_is_stood_in_for_by_its_tokens_alone() {
    for e in samples::all() {
        let value = codec().encode(&e).unwrap();
        let stand_in = codec().stand_in(&value, "too large for broker b");
        let Event::CallFinished(call) = e else {
            assert_eq!(stand_in, None, "{:?}", e.kind());
            continue;
        };
        let stand_in = stand_in.unwrap();
        assert_eq!(
            Some(&stand_in),
            codec().stand_in(&value, "too large for broker b").as_ref()
        );
        let Ok(Event::CallFinished(s)) = codec().decode(&stand_in) else {
            panic!("not a call")
        };
        assert_eq!(s.stand_in.as_deref(), Some("too large for broker b"));
        assert_eq!(
            (
                &s.event_id,
                s.call_index,
                &s.prompt_token_ids,
                &s.completion_logprobs
            ),
            (
                &call.event_id,
                call.call_index,
                &call.prompt_token_ids,
                &call.completion_logprobs
            )
        );
        assert!(
            !s.trainable
                && s.untrainable_reason
                    .unwrap()
                    .contains("too large for broker b")
        );
        assert!(
            s.response_body.is_empty() && s.chat_request.is_empty() && s.chat_response.is_empty()
        );
    }
    assert_eq!(codec().stand_in(b"not an event", "x"), None);
}

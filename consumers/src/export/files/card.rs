//! The dataset card a Hugging Face `load_dataset` reads.

use super::super::{ExportKind, Manifest};

/// The dataset card: a Hugging Face `README.md` whose `configs:` make each
/// harness a config of the tokenized Parquet (`load_dataset(dir, "codex")`),
/// `all` the default. (`datasets` reads one file format per folder, so the
/// conversational JSONL is loaded by its path: the card says how.)
pub fn dataset_card(manifest: &Manifest) -> String {
    let tokens = tokens_file(manifest.kind);
    let mut yaml = String::from("---\nconfigs:\n");
    let config = |yaml: &mut String, name: &str, path: &str, default: bool| {
        yaml.push_str(&format!("- config_name: {name}\n"));
        if default {
            yaml.push_str("  default: true\n");
        }
        yaml.push_str(&format!(
            "  data_files:\n  - split: train\n    path: \"{path}\"\n"
        ));
    };
    config(&mut yaml, "all", &format!("*/{tokens}"), true);
    for harness in manifest.rows.keys() {
        config(&mut yaml, harness, &format!("{harness}/{tokens}"), false);
    }
    yaml.push_str("tags:\n- forgelog\n- agent-trajectories\n---\n\n");
    let table: String = manifest
        .rows
        .iter()
        .map(|(h, n)| {
            let chat = manifest.jsonl_rows.get(h).copied().unwrap_or(0);
            format!("| `{h}` | {n} | {chat} |\n")
        })
        .collect();
    format!(
        "{yaml}# forgelog run `{run}`\n\n\
         Agent trajectories recorded by forgelog {version} (log schema v{schema}): one row per path of \
         each rollout's trajectory tree, with the exact token ids the model was given and sampled.\n\n\
         | harness (config) | rows (Parquet) | rows with messages (JSONL) |\n|---|---|---|\n{table}\n\
         {sampled}\
         `load_dataset(\"path/to/export\", \"HARNESS\")` gives a harness's tokenized rows; \
         `load_dataset(\"json\", data_files=\"path/to/export/HARNESS/sft.jsonl\")` its conversations.\n\n\
         Columns: `input_ids`, `loss_mask` (= `assistant_masks`: 1 where the model sampled), `labels` \
         (-100 off the mask), `sampling_logprobs`, `policy_versions` (-1 where unknown), \
         `finish_reasons` (one per call on the path), `reward` and `advantage` (null before the \
         rollout was scored), and where each row comes from (`run_id`, `task_id`, `group_id`, \
         `harness`, `rollout_id`, `path_index`; `row_id` joins a JSONL row to its Parquet row). \
         The JSONL's `messages` are in the shape Hugging Face chat templates read (content a \
         string, tool-call arguments a mapping; a message that shows images keeps its content as \
         parts, text and `{{\"type\": \"image\"}}`, and the row's `images` lists their URLs in \
         order, as vision-language processors read them); the Parquet keeps them as \
         `messages_json` and `images`.\n\n\
         {rl}`manifest.json` lists the filter, the log offsets read and each file's SHA-256.\n",
        rl = match manifest.kind {
            ExportKind::Sft | ExportKind::Atif => "",
            ExportKind::Rl => "An RL export keeps every path, scored or not; `dpo.jsonl` holds a DPO pair \
                per group whose rewards differ (its best rollout `chosen`, its worst `rejected`, after the \
                `prompt` messages both share) and `kto.jsonl` every scored rollout of such groups \
                (`label`: reward above the group's mean), in TRL's conversational shapes.\n\n",
        },
        sampled = sampled_by(manifest),
        run = manifest.run_id,
        version = manifest.forgelog_version,
        schema = manifest.schema_version,
    )
}

/// The Parquet of tokenized rows an export of `kind` writes per harness.
pub(super) fn tokens_file(kind: ExportKind) -> &'static str {
    match kind {
        ExportKind::Sft => "sft.parquet",
        ExportKind::Rl | ExportKind::Atif => "paths.parquet",
    }
}

/// Which model made the ids, and where its tokenizer and chat template are.
fn sampled_by(manifest: &Manifest) -> String {
    if manifest.models.is_empty() {
        return String::new();
    }
    let list = |names: Vec<String>| names.join(", ");
    let models = list(manifest.models.iter().map(|m| format!("`{m}`")).collect());
    let versions =
        if manifest.policy_versions.is_empty() {
            "policy versions unknown (an upstream that does not report them)".to_string()
        } else {
            format!(
            "policy versions {}; `forgelog export model --run {} --version V` writes version V \
             as a model folder with the tokenizer and chat template that made these ids",
            list(manifest.policy_versions.iter().map(i64::to_string).collect()),
            manifest.run_id
        )
        };
    format!("Sampled by {models}: {versions}.\n\n")
}

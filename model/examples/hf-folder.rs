//! Writes a policy as a Hugging Face model folder (the folder files and
//! `model.safetensors`, f32): what vLLM and `transformers` load. With
//! `--untied`, the output head is a matrix of its own (the input
//! embeddings' copy): vLLM (0.32, CPU) reloads an untied head in place, a
//! tied one it does not (`cargo bench --bench engine-gap`), so a folder a
//! full-weight loop trains through vLLM is written untied.
//!
//! `cargo run -p forgelog-model --release --example hf-folder -- [--untied] [smollm2|FILE|DIR] OUT_DIR`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let untied = args.iter().any(|a| a == "--untied");
    args.retain(|a| a != "--untied");
    let (spec, out) = match args.as_slice() {
        [out] => ("smollm2", out.as_str()),
        [spec, out] => (spec.as_str(), out.as_str()),
        _ => return Err("usage: hf-folder [--untied] [smollm2|FILE|DIR] OUT_DIR".into()),
    };
    let device = candle_core::Device::Cpu;
    let mut policy = forgelog_model::load_policy(spec, &forgelog_stream::models_dir(), &device)?;
    if untied {
        let mut config = policy.model.config().clone();
        config.tie_word_embeddings = false;
        let head = policy.weights["model.embed_tokens.weight"].copy()?;
        policy.weights.insert("lm_head.weight".into(), head);
        policy.model =
            forgelog_model::Transformer::from_weights(&policy.weights, &config, &device)?;
    }
    let out = std::path::Path::new(out);
    std::fs::create_dir_all(out)?;
    for (name, bytes) in forgelog_model::hf::folder_files(&policy, "float32")? {
        std::fs::write(out.join(name), bytes)?;
    }
    candle_core::safetensors::save(&policy.weights, out.join("model.safetensors"))?;
    eprintln!("{} written to {}", policy.name, out.display());
    Ok(())
}

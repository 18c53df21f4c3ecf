//! Writes a policy as a Hugging Face model folder (the folder files and
//! `model.safetensors`, f32): what vLLM and `transformers` load.
//!
//! `cargo run -p forgelog-model --release --example hf-folder -- [smollm2|FILE|DIR] OUT_DIR`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (spec, out) = match args.as_slice() {
        [out] => ("smollm2", out.as_str()),
        [spec, out] => (spec.as_str(), out.as_str()),
        _ => return Err("usage: hf-folder [smollm2|FILE|DIR] OUT_DIR".into()),
    };
    let policy = forgelog_model::load_policy(
        spec,
        &forgelog_stream::models_dir(),
        &candle_core::Device::Cpu,
    )?;
    let out = std::path::Path::new(out);
    std::fs::create_dir_all(out)?;
    for (name, bytes) in forgelog_model::hf::folder_files(&policy, "float32")? {
        std::fs::write(out.join(name), bytes)?;
    }
    candle_core::safetensors::save(&policy.weights, out.join("model.safetensors"))?;
    eprintln!("{} written to {}", policy.name, out.display());
    Ok(())
}

//! `forgelog view`: the trajectory viewer in the browser.

use crate::source::SourceArgs;
use anyhow::Result;
use forgelog_view::{NoTokenizer, TokenText, Viewer};
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Examples:\n  forgelog view --run demo-1   # then open http://127.0.0.1:8200\n  forgelog view --bundle demo-1.bundle.avro   # a bundled run, no broker"
)]
pub struct ViewArgs {
    /// Show only this run (default: every run in the log, or the bundle's run)
    #[arg(long, env = "FORGELOG_RUN")]
    pub run: Option<String>,
    /// Address to serve the pages on
    #[arg(long, default_value = "127.0.0.1:8200")]
    pub listen: SocketAddr,
    /// The model whose tokenizer shows sampled tokens as text: `smollm2`, a .gguf or a Hugging Face directory; `none` shows token ids
    #[arg(long, default_value = "smollm2")]
    pub tokenizer: String,
    #[command(flatten)]
    pub source: SourceArgs,
}

/// A token's text by the run's own tokenizer.
struct Vocabulary(tokenizers::Tokenizer);

impl TokenText for Vocabulary {
    fn token_text(&self, id: u32) -> Option<String> {
        self.0.decode(&[id], false).ok()
    }
}

fn tokens(spec: &str) -> Arc<dyn TokenText> {
    if spec == "none" {
        return Arc::new(NoTokenizer);
    }
    match forgelog_model::load_tokenizer(spec, &forgelog_stream::models_dir()) {
        Ok(t) => Arc::new(Vocabulary(t)),
        Err(e) => {
            eprintln!("view: no tokenizer ({e}); sampled tokens show as ids");
            Arc::new(NoTokenizer)
        }
    }
}

pub fn run(rt: &tokio::runtime::Runtime, args: ViewArgs) -> Result<()> {
    rt.block_on(async {
        let listener = forgelog_http::listen(args.listen).await?;
        let source = args.source.clone();
        let wanted = args.run.clone();
        let (log, run) =
            tokio::task::spawn_blocking(move || source.open_any(wanted.as_deref())).await??;
        let viewer = Viewer::start(log, run.clone(), listener, tokens(&args.tokenizer)).await?;
        let url = format!("http://{}", viewer.addr());
        let page = match &run {
            Some(run) => format!("{url}/runs/{run}"),
            None => url,
        };
        eprintln!(
            "view: {} events of {} runs read; serving {page} (Ctrl-C stops)",
            viewer.events_read, viewer.runs
        );
        forgelog_stream::shutdown_signal()?.await;
        viewer.stop().await;
        Ok(())
    })
}

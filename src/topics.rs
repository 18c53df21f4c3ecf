//! `forgelog topics create|list`.

use crate::BrokerArgs;
use anyhow::Result;
use forgelog_schemas::Topic;
use forgelog_stream::admin::{self, TopicLayout};

#[derive(clap::Subcommand)]
pub enum TopicsAction {
    /// Create every forgelog topic that is missing (infinite retention)
    #[command(
        after_help = "Example:\n  forgelog topics create --partitions 6 --brokers kafka:9092"
    )]
    Create {
        /// Partitions per topic (the most consumers of one group that share a topic)
        #[arg(long, default_value_t = 3)]
        partitions: i32,
        /// Copies of each partition (1 on a single broker)
        #[arg(long, default_value_t = 1)]
        replication: i32,
        /// The topics' max.message.bytes: the largest record batch the broker
        /// takes. The proxy reads it at start and keeps larger events as claim
        /// checks (a broker that does not enforce it, like tansu, still tells it)
        #[arg(long)]
        max_message_bytes: Option<usize>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// List topics with their partition and message counts
    #[command(after_help = "Example:\n  forgelog topics list --json")]
    List {
        /// One JSON array of {name, partitions, messages} instead of the table
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArgs,
    },
}

pub fn run(rt: &tokio::runtime::Runtime, action: TopicsAction) -> Result<()> {
    match action {
        TopicsAction::Create {
            partitions,
            replication,
            max_message_bytes,
            broker,
        } => {
            let layout = TopicLayout {
                partitions,
                replication,
                max_message_bytes,
            };
            let created = rt.block_on(admin::create_topics(&broker.config(), &layout))?;
            for t in Topic::ALL {
                let state = if created.iter().any(|c| c == t.name()) {
                    "created"
                } else {
                    "exists"
                };
                println!("{:<24} {state}", t.name());
            }
        }
        TopicsAction::List { json, broker } => {
            let topics = admin::list_topics(&broker.config())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&topics)?);
                return Ok(());
            }
            println!("{:<24} {:>10} {:>10}", "topic", "partitions", "messages");
            for t in topics {
                println!("{:<24} {:>10} {:>10}", t.name, t.partitions, t.messages);
            }
        }
    }
    Ok(())
}

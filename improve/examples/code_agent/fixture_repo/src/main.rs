use clap::{Parser, Subcommand};

mod commands;
mod config;
mod filter;
mod llm;
mod path_resolve;

/// Command-line arguments.
#[derive(Parser)]
#[command(name = "tern", version)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
    /// Path to the configuration file.
    #[arg(long, default_value = "tern.toml")]
    config: String,
}

/// What tern can do.
#[derive(Subcommand)]
enum Commands {
    View { target: String },
    TextSearch { pattern: String },
    Run { command: Vec<String> },
    Agent { question: String },
    Config,
}

/// One agent session: the question and the turns used so far.
struct Session {
    question: String,
    turns: u32,
}

fn main() {
    let cli = Cli::parse();
    let settings = config::load(&cli.config).unwrap_or_default();
    match cli.command {
        Commands::View { target } => commands::view::run(&target),
        Commands::TextSearch { pattern } => commands::search::run(&pattern),
        Commands::Run { command } => commands::run::run(&command),
        Commands::Agent { question } => {
            let session = Session { question, turns: 0 };
            commands::agent(&settings, session.question, session.turns)
        }
        Commands::Config => println!("{settings:?}"),
    }
}

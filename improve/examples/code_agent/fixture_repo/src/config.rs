//! Settings, read from tern.toml; anything missing takes its default.

use crate::llm::Provider;

/// How answers are printed.
pub enum OutputFormat {
    Text,
    Json,
    Markdown,
}

/// The settings of one tern installation.
#[derive(Debug)]
pub struct Config {
    pub provider: Provider,
    pub max_turns: u32,
    pub max_cycles: u32,
    pub timeout_secs: u64,
    pub output_limit: usize,
    pub format: OutputFormat,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            provider: Provider::Anthropic,
            max_turns: 10,
            max_cycles: 5,
            timeout_secs: 30,
            output_limit: 1500,
            format: OutputFormat::Text,
        }
    }
}

/// A settings file that could not be read.
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

pub fn load(path: &str) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        path: path.to_string(),
        message: e.to_string(),
    })?;
    parse(&text)
}

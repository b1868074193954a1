//! The commands tern runs for a person or for the agent.

pub mod run;
pub mod search;
pub mod view;

use crate::config::Config;

/// Hand a question to the Lua agent (scripts/agent.lua).
pub fn agent(settings: &Config, question: String, turns: u32) {
    let script = include_str!("../../scripts/agent.lua");
    crate::lua::run(script, settings, &question, turns);
}

//! `run program args...`: only programs on the allowlist may run.

/// The programs the agent may run.
pub const ALLOWED: [&str; 4] = ["ls", "wc", "head", "grep"];

pub fn run(command: &[String]) {
    let Some(program) = command.first() else { return };
    if !ALLOWED.contains(&program.as_str()) {
        eprintln!("run: {program} is not allowed; allowed: {}", ALLOWED.join(", "));
        return;
    }
    let status = std::process::Command::new(program).args(&command[1..]).status();
    if let Err(error) = status {
        eprintln!("run: {error}");
    }
}

//! `view path` and `view path:start-end`.

use crate::path_resolve::resolve;

/// Print a file with line numbers, a line range of it, or a directory listing.
pub fn run(target: &str) {
    let (path, range) = match target.rsplit_once(':') {
        Some((path, range)) => (path, parse_range(range)),
        None => (target, None),
    };
    match resolve(std::path::Path::new("."), path) {
        Some(found) => show(&found, range),
        None => eprintln!("view: no such file or directory: {path}"),
    }
}

fn parse_range(text: &str) -> Option<(usize, usize)> {
    let (start, end) = text.split_once('-')?;
    Some((start.parse().ok()?, end.parse().ok()?))
}

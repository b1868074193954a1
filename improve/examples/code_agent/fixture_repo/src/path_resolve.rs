//! Resolving what a user typed into a path: exact paths first, then fuzzy matches.
//!
//! `view llm.rs` works although the file is `src/llm.rs`: the name is matched against every
//! path of the repository, and the best match wins when it is clearly the best.

use std::path::{Path, PathBuf};

/// The largest edit distance a fuzzy match may have.
const MAX_DISTANCE: usize = 3;

/// A candidate path and how well it matched.
pub struct Match {
    pub path: PathBuf,
    pub score: i32,
}

/// Resolve `query` against the files under `root`.
pub fn resolve(root: &Path, query: &str) -> Option<PathBuf> {
    let (path_part, _symbol) = split_symbol(query);
    let query = normalize(&expand_home(path_part));
    if let Some(found) = resolve_exact(root, &query) {
        return Some(found);
    }
    resolve_fuzzy(root, &query)
}

/// The path itself, when it exists.
pub fn resolve_exact(root: &Path, query: &str) -> Option<PathBuf> {
    let candidate = root.join(query);
    if candidate.exists() {
        Some(candidate)
    } else {
        None
    }
}

/// The best fuzzy match, when one is clearly better than the rest.
pub fn resolve_fuzzy(root: &Path, query: &str) -> Option<PathBuf> {
    if is_glob(query) {
        return None;
    }
    let found = candidates(root, query);
    let ranked = rank_matches(found);
    match ranked.as_slice() {
        [best] => Some(best.path.clone()),
        [best, second, ..] if best.score > second.score => Some(best.path.clone()),
        _ => None,
    }
}

/// `src/llm.rs/Provider` -> (`src/llm.rs`, Some(`Provider`)).
pub fn split_symbol(query: &str) -> (&str, Option<&str>) {
    match query.find(".rs/") {
        Some(at) => (&query[..at + 3], Some(&query[at + 4..])),
        None => (query, None),
    }
}

/// Forward slashes, no `./` prefix, no trailing slash.
pub fn normalize(query: &str) -> String {
    let query = query.replace('\\', "/");
    let query = query.trim_start_matches("./");
    query.trim_end_matches('/').to_string()
}

/// `~/x` -> `$HOME/x`.
pub fn expand_home(query: &str) -> String {
    match (query.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) => format!("{home}/{rest}"),
        _ => query.to_string(),
    }
}

/// Whether the query is a glob such as `src/*.rs`.
pub fn is_glob(query: &str) -> bool {
    query.contains('*') || query.contains('?') || query.contains('[')
}

/// Every file under `root`, depth first, hidden directories skipped.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if path.is_dir() && !hidden {
                stack.push(path);
            } else if !hidden {
                out.push(path);
            }
        }
    }
    out
}

/// The files whose name is close enough to the query.
pub fn candidates(root: &Path, query: &str) -> Vec<Match> {
    walk(root)
        .into_iter()
        .filter_map(|path| {
            let name = path.to_string_lossy().to_string();
            let value = score(&name, query);
            (value > 0).then_some(Match { path, score: value })
        })
        .collect()
}

/// Higher is better: a suffix match beats a shared prefix, which beats an edit.
pub fn score(name: &str, query: &str) -> i32 {
    if name.ends_with(query) {
        return 100 - (name.len() - query.len()) as i32;
    }
    let shared = common_prefix(name, query);
    if shared > 0 && query.len() - shared <= MAX_DISTANCE {
        return 50 + shared as i32;
    }
    0
}

/// How many leading characters two strings share.
pub fn common_prefix(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

/// Best first; ties keep the shorter path first.
pub fn rank_matches(mut found: Vec<Match>) -> Vec<Match> {
    found.sort_by(|a, b| {
        b.score
            .cmp(&a.score)
            .then(a.path.as_os_str().len().cmp(&b.path.as_os_str().len()))
    });
    found.dedup_by(|a, b| a.path == b.path);
    found
}

//! Filters that decide which files a search looks at.

/// How a filter pattern is matched.
pub enum FilterKind {
    Glob,
    Regex,
    Exact,
    Prefix,
}

/// How serious a finding is.
pub enum Severity {
    Low,
    Medium,
    High,
    Critical,
}

/// A filter over paths: include or exclude what matches.
pub struct Filter {
    pub kind: FilterKind,
    pub pattern: String,
    pub exclude: bool,
}

/// A finding of an audit, with where it is.
pub struct Finding {
    pub path: String,
    pub line: u32,
    pub severity: Severity,
}

impl Filter {
    pub fn matches(&self, path: &str) -> bool {
        let hit = match self.kind {
            FilterKind::Glob => glob_match(&self.pattern, path),
            FilterKind::Regex => regex_match(&self.pattern, path),
            FilterKind::Exact => self.pattern == path,
            FilterKind::Prefix => path.starts_with(&self.pattern),
        };
        hit != self.exclude
    }
}

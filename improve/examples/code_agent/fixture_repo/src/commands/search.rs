//! `text-search "pattern"`: every line that contains the pattern, as `path:line: text`.

pub fn run(pattern: &str) {
    let mut matches = 0;
    for path in crate::path_resolve::walk(std::path::Path::new(".")) {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        for (number, line) in text.lines().enumerate() {
            if line.contains(pattern) {
                println!("{}:{}: {}", path.display(), number + 1, line.trim());
                matches += 1;
            }
        }
    }
    println!("{matches} matches");
}

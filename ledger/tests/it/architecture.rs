//! The module structure holds: the files of a store's folder import one another without a
//! circle, so each can be read after the files it imports, and none imports its parent's
//! every item (`use super::*`) where a list would say what it needs. And the pure core,
//! `ledger-core`, lists no I/O crate among its dependencies.
//!
//! The check reads the source, not the compiler's view: `use` declarations (braced groups
//! over several lines included) and paths in the code (`super::x::Y`, `self::x::Y`,
//! `crate::store::pg::x::Y`, and in `mod.rs` a child's `x::Y`), comments and literals left
//! out. A file that names an item of another file of the folder depends on it; `mod x;`
//! alone is no dependency. `folder_graph` takes any folder, so another store's can be held
//! to the same rule with a test of two lines.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The PostgreSQL store's files import one another without a circle, and none with
/// `use super::*` outside its tests.
#[test]
fn store_pg_has_no_import_circle() {
    holds_no_circle("src/store/pg");
}

/// The same for the sled store's files.
#[test]
fn store_sled_has_no_import_circle() {
    holds_no_circle("src/store/sled");
}

/// The core does no I/O, and its manifest says so: `ledger-core` depends on no storage,
/// network, runtime or thread crate. Only its own dependencies are read; what they pull in
/// is what `cargo tree -p ledger-core -e normal` lists (serde, chrono, sha2 and the like).
#[test]
fn ledger_core_depends_on_no_io_crate() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ledger-core/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let deps = dependencies(&text);
    println!("ledger-core depends on: {}", deps.join(", "));
    assert!(
        deps.iter().any(|d| d == "serde"),
        "the manifest was not read as expected: {deps:?}"
    );
    let io: Vec<&String> = deps.iter().filter(|d| is_io_crate(d)).collect();
    assert!(
        io.is_empty(),
        "ledger-core must do no I/O, yet {} lists {io:?}",
        manifest.display()
    );
}

/// Crates that reach storage, the network, an async runtime or threads, by name or family
/// (`tokio` stands for `tokio-postgres` and `tokio-util` too).
const IO_CRATES: &[&str] = &[
    "sled",
    "fs2",
    "libc",
    "tempfile",
    "tokio",
    "mio",
    "futures",
    "async-trait",
    "hyper",
    "axum",
    "tower",
    "ureq",
    "reqwest",
    "postgres",
    "deadpool",
    "lapin",
    "amq-protocol",
    "crossbeam",
    "parking_lot",
    "rayon",
];

fn is_io_crate(name: &str) -> bool {
    IO_CRATES.iter().any(|io| {
        name == *io
            || name
                .strip_prefix(io)
                .is_some_and(|rest| rest.starts_with(['-', '_']))
    })
}

/// The crates a manifest's `[dependencies]` name (target-specific ones and build
/// dependencies included, dev-dependencies not): each entry's key, or the `package` it
/// renames.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(header) = line.strip_prefix('[') {
            section = header.trim_end_matches(']').trim().to_owned();
            // `[dependencies.name]`: the entry is the header.
            if let Some(name) = section.strip_prefix("dependencies.") {
                out.push(name.trim_matches('"').to_owned());
            }
            continue;
        }
        let listed = section == "dependencies"
            || section == "build-dependencies"
            || (section.starts_with("target.")
                && (section.ends_with(".dependencies")
                    || section.ends_with(".build-dependencies")));
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if section.starts_with("dependencies.") && key.trim() == "package" {
            out.pop();
            out.push(value.trim().trim_matches('"').to_owned());
            continue;
        }
        if !listed {
            continue;
        }
        let renamed = value
            .split_once("package")
            .and_then(|(_, rest)| rest.trim_start().strip_prefix('='))
            .and_then(|rest| rest.trim_start().strip_prefix('"'))
            .and_then(|rest| rest.split('"').next());
        let name = key.trim().split('.').next().unwrap_or("").trim_matches('"');
        out.push(renamed.unwrap_or(name).to_owned());
    }
    out
}

/// The files of the folder at `relative` (to the crate) import one another without a
/// circle, and none with `use super::*` outside its tests.
fn holds_no_circle(relative: &str) {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let graph = folder_graph(&folder).unwrap();
    println!("{}", graph.describe());
    assert!(
        graph.files.len() > 1,
        "{} holds fewer files than expected: {:?}",
        folder.display(),
        graph.files
    );
    let mut problems = Vec::new();
    if !graph.globs.is_empty() {
        problems.push(format!(
            "`use super::*` outside tests at {}",
            graph.globs.join(", ")
        ));
    }
    if let Some(circle) = graph.circle() {
        problems.push(format!("an import circle: {}", circle.join(" -> ")));
    }
    assert!(
        problems.is_empty(),
        "in {}:\n{}\nthe graph:\n{}",
        folder.display(),
        problems.join("\n"),
        graph.describe()
    );
}

/// The dependencies among the `.rs` files of one folder (a module `mod.rs` and its
/// children), as the source states them.
#[derive(Debug, Default)]
pub struct FolderGraph {
    /// Every `.rs` file of the folder, by name.
    pub files: BTreeSet<String>,
    /// file -> the files of the folder it names an item of.
    pub edges: BTreeMap<String, BTreeSet<String>>,
    /// `use super::*` outside a `#[cfg(test)]` module, as "file:line".
    pub globs: Vec<String>,
}

impl FolderGraph {
    /// A circle of imports as the files in order, the first again at the end; `None` if
    /// there is none.
    pub fn circle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        fn visit<'a>(
            g: &'a FolderGraph,
            file: &'a str,
            marks: &mut BTreeMap<&'a str, Mark>,
            stack: &mut Vec<&'a str>,
        ) -> Option<Vec<String>> {
            marks.insert(file, Mark::Open);
            stack.push(file);
            for next in g.edges.get(file).into_iter().flatten() {
                match marks.get(next.as_str()).copied().unwrap_or(Mark::New) {
                    Mark::Open => {
                        let from = stack.iter().position(|f| *f == next.as_str())?;
                        let mut circle: Vec<String> =
                            stack[from..].iter().map(|f| (*f).to_owned()).collect();
                        circle.push(next.clone());
                        return Some(circle);
                    }
                    Mark::New => {
                        if let Some(circle) = visit(g, next, marks, stack) {
                            return Some(circle);
                        }
                    }
                    Mark::Done => {}
                }
            }
            stack.pop();
            marks.insert(file, Mark::Done);
            None
        }
        let mut marks = BTreeMap::new();
        for file in &self.files {
            if marks.get(file.as_str()).copied().unwrap_or(Mark::New) == Mark::New
                && let Some(circle) = visit(self, file, &mut marks, &mut Vec::new())
            {
                return Some(circle);
            }
        }
        None
    }

    /// One line per file: what it imports from.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for file in &self.files {
            let to: Vec<&str> = self
                .edges
                .get(file)
                .into_iter()
                .flatten()
                .map(String::as_str)
                .collect();
            let to = if to.is_empty() {
                "nothing".to_owned()
            } else {
                to.join(", ")
            };
            let _ = writeln!(out, "{file} -> {to}");
        }
        out
    }
}

/// Reads the `.rs` files directly in `folder` and the dependencies among them.
///
/// A child file `x.rs` is the module `x` under the folder's `mod.rs`; a path resolves to
/// the folder when it climbs there with `super` (counting inline modules such as
/// `mod tests { … }`), with `self` in `mod.rs`, or with `crate::` and the folder's module
/// path (what follows the last `src` in `folder`). At the folder, a child's name makes the
/// dependency on that child, any other name one on `mod.rs`.
pub fn folder_graph(folder: &Path) -> std::io::Result<FolderGraph> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(folder)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "rs"))
        .collect();
    paths.sort();
    let children: BTreeSet<String> = paths
        .iter()
        .filter_map(|p| p.file_stem()?.to_str().map(str::to_owned))
        .filter(|stem| stem != "mod")
        .collect();
    let module_path = module_path(folder);
    let mut graph = FolderGraph::default();
    for path in &paths {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let name = name.to_owned();
        let source = std::fs::read_to_string(path)?;
        let file = FileScan {
            name: &name,
            is_mod: name == "mod.rs",
            children: &children,
            module_path: &module_path,
        };
        let (edges, globs) = file.scan(&source);
        graph.edges.insert(name.clone(), edges);
        graph
            .globs
            .extend(globs.into_iter().map(|line| format!("{name}:{line}")));
        graph.files.insert(name);
    }
    Ok(graph)
}

/// The module path of a folder under a crate's `src`: `["store", "pg"]` for
/// `ledger/src/store/pg`; empty when the folder is under no `src`.
fn module_path(folder: &Path) -> Vec<String> {
    let parts: Vec<String> = folder
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_owned))
        .collect();
    match parts.iter().rposition(|p| p == "src") {
        Some(i) => parts[i + 1..].to_vec(),
        None => Vec::new(),
    }
}

// ---- tokens ------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The source's identifiers and punctuation with their lines, without comments, string,
/// char and number literals, or lifetimes.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i, &mut line);
        } else if c == '\'' {
            i = skip_quote(&chars, i);
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = at(i);
            let raw = matches!(word.as_str(), "r" | "br" | "cr");
            if raw && (next == '"' || (next == '#' && matches!(at(i + 1), '"' | '#'))) {
                i = skip_raw_string(&chars, i, &mut line);
            } else if matches!(word.as_str(), "b" | "c") && next == '"' {
                i = skip_string(&chars, i, &mut line);
            } else if word == "b" && next == '\'' {
                i = skip_quote(&chars, i);
            } else {
                out.push((Tok::Ident(word), line));
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// Past a `"…"` string starting at `i`.
fn skip_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    i += 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            c => {
                if c == '\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    i
}

/// Past a raw string `#…#"…"#…#` whose hashes start at `i` (after its `r`).
fn skip_raw_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1;
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        if chars[i] == '\n' {
            *line += 1;
        }
        i += 1;
    }
    i
}

/// Past a char literal or a lifetime starting at the quote at `i`.
fn skip_quote(chars: &[char], i: usize) -> usize {
    match (chars.get(i + 1), chars.get(i + 2)) {
        (Some('\\'), _) => {
            let mut j = i + 3;
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            j + 1
        }
        (Some(_), Some('\'')) => i + 3,
        _ => {
            let mut j = i + 1;
            while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            j
        }
    }
}

// ---- one file ----------------------------------------------------------------------------

struct FileScan<'a> {
    name: &'a str,
    is_mod: bool,
    children: &'a BTreeSet<String>,
    module_path: &'a [String],
}

/// An inline module being read: the brace depth its body closes back to, and whether it
/// is `#[cfg(test)]`.
struct Inline {
    depth: usize,
    test: bool,
}

impl FileScan<'_> {
    /// The files of the folder this file depends on, and the lines of its `use super::*`
    /// outside `#[cfg(test)]` modules.
    fn scan(&self, src: &str) -> (BTreeSet<String>, Vec<usize>) {
        let toks = tokens(src);
        let mut edges = BTreeSet::new();
        let mut globs = Vec::new();
        let mut inline: Vec<Inline> = Vec::new();
        let mut depth = 0usize;
        let mut i = 0;
        while i < toks.len() {
            let ident = |k: usize| match toks.get(k) {
                Some((Tok::Ident(w), _)) => Some(w.as_str()),
                _ => None,
            };
            match &toks[i].0 {
                Tok::Punct('{') => {
                    depth += 1;
                    i += 1;
                }
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|m| m.depth == depth) {
                        inline.pop();
                    }
                    i += 1;
                }
                Tok::Ident(w)
                    if w == "mod"
                        && ident(i + 1).is_some()
                        && toks.get(i + 2).map(|t| &t.0) == Some(&Tok::Punct('{')) =>
                {
                    inline.push(Inline {
                        depth,
                        test: cfg_test_before(&toks, i),
                    });
                    i += 2;
                }
                Tok::Ident(w)
                    if w == "use" && toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Punct('<')) =>
                {
                    let line = toks[i].1;
                    let mut j = i + 1;
                    let mut paths = Vec::new();
                    use_tree(&toks, &mut j, &mut Vec::new(), &mut paths);
                    let levels = inline.len();
                    let in_test = inline.iter().any(|m| m.test);
                    for (path, glob) in paths {
                        if glob && !in_test && path.iter().all(|s| s == "super") && !path.is_empty()
                        {
                            globs.push(line);
                        }
                        edges.extend(self.resolve(&path, levels));
                    }
                    i = j;
                }
                Tok::Ident(_) if i == 0 || toks[i - 1].0 != Tok::Path => {
                    // A path in the code: its segments up to the first that is not
                    // followed by `::`. Skipped after `(in` (a `pub(in …)` visibility),
                    // not after a `for` loop's `in`, which opens a path like any other.
                    let after_in = i > 1
                        && toks[i - 1].0 == Tok::Ident("in".into())
                        && toks[i - 2].0 == Tok::Punct('(');
                    let mut path = Vec::new();
                    let mut j = i;
                    while let Some(w) = ident(j) {
                        path.push(w.to_owned());
                        if toks.get(j + 1).map(|t| &t.0) == Some(&Tok::Path) {
                            j += 2;
                        } else {
                            break;
                        }
                    }
                    if path.len() > 1 && !after_in {
                        edges.extend(self.resolve(&path, inline.len()));
                    }
                    i = j + 1;
                }
                _ => i += 1,
            }
        }
        edges.remove(self.name);
        (edges, globs)
    }

    /// The file of the folder that `path` names an item of, seen from this file inside
    /// `levels` inline modules; `None` for a path outside the folder or inside this file.
    fn resolve(&self, path: &[String], levels: usize) -> Option<String> {
        // How far below the folder's module this code is.
        let here = usize::from(!self.is_mod) + levels;
        let first = path.first()?.as_str();
        let rest: &[String] = match first {
            "crate" => {
                let below = path.get(1..)?;
                if self.module_path.is_empty() || !below.starts_with(self.module_path) {
                    return None;
                }
                &below[self.module_path.len()..]
            }
            "super" | "self" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let skip = if first == "self" { 1 } else { supers };
                if supers > here || (here - supers) > 0 {
                    return None;
                }
                &path[skip..]
            }
            _ if here == 0 => path,
            _ => return None,
        };
        match rest.first() {
            Some(child) if self.children.contains(child) => Some(format!("{child}.rs")),
            // An item of the folder's own module (or the module itself).
            _ if first == "super" || first == "crate" => Some("mod.rs".to_owned()),
            _ => None,
        }
    }
}

/// Whether the `mod` at `at` carries `#[cfg(test)]` (or another `cfg` naming `test`)
/// among the attributes just before it.
fn cfg_test_before(toks: &[(Tok, usize)], at: usize) -> bool {
    let mut k = at;
    // Past a visibility: `pub` or `pub(…)`.
    if k > 0 && toks[k - 1].0 == Tok::Punct(')') {
        while k > 0 && toks[k - 1].0 != Tok::Punct('(') {
            k -= 1;
        }
        k = k.saturating_sub(1);
    }
    if k > 0 && toks[k - 1].0 == Tok::Ident("pub".into()) {
        k -= 1;
    }
    // Attributes, from the last back: `# [ … ]`.
    while k > 0 && toks[k - 1].0 == Tok::Punct(']') {
        let close = k - 1;
        let mut open = close;
        let mut nest = 0;
        loop {
            match toks[open].0 {
                Tok::Punct(']') => nest += 1,
                Tok::Punct('[') => nest -= 1,
                _ => {}
            }
            if nest == 0 || open == 0 {
                break;
            }
            open -= 1;
        }
        let words: Vec<&str> = toks[open..close]
            .iter()
            .filter_map(|(t, _)| match t {
                Tok::Ident(w) => Some(w.as_str()),
                _ => None,
            })
            .collect();
        if words.first() == Some(&"cfg") && words.contains(&"test") {
            return true;
        }
        if open == 0 || toks[open - 1].0 != Tok::Punct('#') {
            return false;
        }
        k = open - 1;
    }
    false
}

/// Reads one use tree at `*j` (up to its `;`, `,` or `}`), adding each path it names to
/// `out` with whether it ends in `*`. `prefix` is the path of the braces it is in.
fn use_tree(
    toks: &[(Tok, usize)],
    j: &mut usize,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, bool)>,
) {
    let tok = |k: usize| toks.get(k).map(|t| &t.0);
    let start = prefix.len();
    // A leading `::` (an extern crate's path) adds nothing.
    if tok(*j) == Some(&Tok::Path) {
        *j += 1;
    }
    while let Some(Tok::Ident(w)) = tok(*j) {
        *j += 1;
        if tok(*j) != Some(&Tok::Path) {
            let mut path = prefix.clone();
            if w != "self" {
                path.push(w.clone());
            }
            out.push((path, false));
            // `as name`: the path is already taken.
            if tok(*j) == Some(&Tok::Ident("as".into())) {
                *j += 2;
            }
            prefix.truncate(start);
            return;
        }
        prefix.push(w.clone());
        *j += 1;
    }
    match tok(*j) {
        Some(Tok::Punct('*')) => {
            *j += 1;
            out.push((prefix.clone(), true));
        }
        Some(Tok::Punct('{')) => {
            *j += 1;
            loop {
                match tok(*j) {
                    None => break,
                    Some(Tok::Punct('}')) => {
                        *j += 1;
                        break;
                    }
                    Some(Tok::Punct(',')) => *j += 1,
                    Some(_) => {
                        let before = *j;
                        use_tree(toks, j, prefix, out);
                        if *j == before {
                            *j += 1;
                        }
                    }
                }
            }
        }
        _ => {}
    }
    prefix.truncate(start);
}

// ---- the check checked -------------------------------------------------------------------

/// A folder of files in a temporary `src/store/fixture`, for the check's own tests.
fn fixture(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("src/store/fixture");
    std::fs::create_dir_all(&folder).unwrap();
    for (name, text) in files {
        std::fs::write(folder.join(name), text).unwrap();
    }
    (dir, folder)
}

#[test]
fn a_planted_circle_is_found_with_its_files_in_order() {
    // mod.rs -> b.rs (a re-export), b.rs -> a.rs (a multi-line group), a.rs -> mod.rs.
    let (_dir, folder) = fixture(&[
        (
            "mod.rs",
            "mod a;\nmod b;\npub use b::Bee;\npub struct Top;\n",
        ),
        (
            "a.rs",
            "//! super::b::Bee in a comment is no import\nuse super::Top;\npub struct Ay(Top);\n",
        ),
        (
            "b.rs",
            "use std::fmt;\nuse super::{\n    a::Ay,\n};\n\
             const S: &str = \"super::Top\";\npub struct Bee(Ay);\n",
        ),
    ]);
    let graph = folder_graph(&folder).unwrap();
    assert_eq!(
        graph.describe(),
        "a.rs -> mod.rs\nb.rs -> a.rs\nmod.rs -> b.rs\n"
    );
    let circle = graph.circle().unwrap();
    assert_eq!(circle, ["a.rs", "mod.rs", "b.rs", "a.rs"]);
}

#[test]
fn a_circle_through_paths_in_the_code_is_found() {
    // No `use` between a and b: each names the other's item in a path.
    let (_dir, folder) = fixture(&[
        ("mod.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() { super::b::g() }\n"),
        (
            "b.rs",
            "pub fn g() { crate::store::fixture::a::h() }\npub fn h() {}\n",
        ),
    ]);
    let graph = folder_graph(&folder).unwrap();
    assert_eq!(graph.circle().unwrap(), ["a.rs", "b.rs", "a.rs"]);
}

#[test]
fn a_layered_folder_has_no_circle() {
    // mod.rs on top, a below it, b below both; a test module's `super` is its own file.
    let (_dir, folder) = fixture(&[
        (
            "mod.rs",
            "mod a;\nmod b;\nuse self::a::Ay;\npub use b::Bee;\nfn f() -> a::Ay { todo!() }\n",
        ),
        (
            "a.rs",
            "use super::b::{self, Bee};\npub(in crate::store::fixture) struct Ay(Bee);\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::b::Bee as B;\n}\n",
        ),
        (
            "b.rs",
            "pub struct Bee;\nimpl Bee { fn f(&self) -> &'static str { \"}\" } }\n",
        ),
    ]);
    let graph = folder_graph(&folder).unwrap();
    assert_eq!(
        graph.describe(),
        "a.rs -> b.rs\nb.rs -> nothing\nmod.rs -> a.rs, b.rs\n"
    );
    assert_eq!(graph.circle(), None);
    assert!(graph.globs.is_empty(), "{:?}", graph.globs);
}

#[test]
fn a_path_after_a_for_loop_s_in_is_a_dependency() {
    // `in` comes before a path in a `pub(in …)` visibility, no dependency, and in a `for`
    // loop, one.
    let (_dir, folder) = fixture(&[
        ("mod.rs", "mod a;\nmod b;\n"),
        (
            "a.rs",
            "pub(in crate::store::fixture) fn f() {\n    for x in super::b::all() {}\n}\n",
        ),
        ("b.rs", "pub fn all() -> Vec<u8> { Vec::new() }\n"),
    ]);
    let graph = folder_graph(&folder).unwrap();
    assert_eq!(
        graph.describe(),
        "a.rs -> b.rs\nb.rs -> nothing\nmod.rs -> nothing\n"
    );
}

#[test]
fn use_super_glob_is_reported_outside_tests() {
    let (_dir, folder) = fixture(&[
        ("mod.rs", "mod a;\npub struct Top;\n"),
        (
            "a.rs",
            "\nuse super::*;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
    ]);
    let graph = folder_graph(&folder).unwrap();
    assert_eq!(graph.globs, ["a.rs:2"]);
    assert_eq!(graph.describe(), "a.rs -> mod.rs\nmod.rs -> nothing\n");
}

#[test]
fn an_io_crate_in_a_manifest_is_found_however_it_is_listed() {
    let manifest = r#"
[package]
name = "x"
tokio = "not a dependency: a package key"

[dependencies]
serde.workspace = true
chrono = { workspace = true }
store = { package = "sled", version = "0.34" } # renamed

[target.'cfg(unix)'.dependencies]
tokio-postgres = "0.7"

[dependencies.pool]
version = "0.14"
package = "deadpool-postgres"

[dev-dependencies]
tempfile = "3"
"#;
    let deps = dependencies(manifest);
    assert_eq!(
        deps,
        [
            "serde",
            "chrono",
            "sled",
            "tokio-postgres",
            "deadpool-postgres"
        ]
    );
    let io: Vec<&String> = deps.iter().filter(|d| is_io_crate(d)).collect();
    assert_eq!(io, ["sled", "tokio-postgres", "deadpool-postgres"]);
    for pure in [
        "serde",
        "serde_json",
        "postcard",
        "sha2",
        "thiserror",
        "itoa",
        "sledge",
    ] {
        assert!(!is_io_crate(pure), "{pure}");
    }
    for io in [
        "crossbeam-channel",
        "parking_lot",
        "tokio",
        "hyper-util",
        "lapin",
    ] {
        assert!(is_io_crate(io), "{io}");
    }
}

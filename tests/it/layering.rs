//! The layout is the architecture: this test fails when an import goes upward.
//!
//! Layers, lowest first (`src/lib.rs` and `docs/architecture.md` say the same):
//! leaves (`config`, `failpoints`, `backoff`) ← adapters (`postgres`, `sink`, `ops`) ← domain (`outbox`)
//! ← pipelines and control (`relay`, `control`, `poll`, `retention`) ← entry points (`demo`, `cli`).
//! Modules of one layer do not import each other, except `poll` → `control` (the poller reuses
//! the setup checks) and `relay`, `poll` → `retention` (the active instance starts it). The graph of top-level modules must also be acyclic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it may import.
const ALLOWED: &[(&str, &[&str])] = &[
    ("config", &[]),
    ("failpoints", &[]),
    ("backoff", &[]),
    ("postgres", &["config", "failpoints"]),
    ("sink", &["config", "failpoints", "backoff"]),
    ("ops", &["config", "failpoints"]),
    ("outbox", &["config", "failpoints", "postgres", "sink", "ops"]),
    (
        "relay",
        &[
            "config",
            "failpoints",
            "backoff",
            "postgres",
            "sink",
            "ops",
            "outbox",
            "retention",
        ],
    ),
    (
        "retention",
        &["config", "failpoints", "postgres", "sink", "ops", "outbox"],
    ),
    (
        "control",
        &["config", "failpoints", "postgres", "sink", "ops", "outbox", "retention"],
    ),
    (
        "poll",
        &[
            "config",
            "failpoints",
            "backoff",
            "postgres",
            "sink",
            "ops",
            "outbox",
            "control",
            "retention",
        ],
    ),
    (
        "demo",
        &[
            "config",
            "failpoints",
            "postgres",
            "sink",
            "ops",
            "outbox",
            "relay",
            "control",
            "poll",
            "retention",
        ],
    ),
    (
        "cli",
        &[
            "config",
            "failpoints",
            "postgres",
            "sink",
            "ops",
            "outbox",
            "relay",
            "control",
            "poll",
            "retention",
            "demo",
        ],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `crate::name` references in code (comments dropped), as top-level module names.
fn crate_references(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
            rest = after;
        }
    }
    found
}

/// Top-level module → the other top-level modules its files name.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let first = relative
            .components()
            .next()
            .expect("a component")
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(crate_references(&text).into_iter().filter(|m| *m != module));
    }
    graph
}

#[test]
fn imports_only_go_down_the_layers() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut violations = Vec::new();
    for (module, imports) in import_graph() {
        let Some(may) = allowed.get(module.as_str()) else {
            violations.push(format!(
                "src/{module} is a top-level module this test does not know: add it to ALLOWED in tests/it/layering.rs at its layer"
            ));
            continue;
        };
        for import in imports {
            if !may.contains(&import.as_str()) {
                violations.push(format!(
                    "src/{module} imports crate::{import}, a layer above or beside it"
                ));
            }
        }
    }
    assert!(violations.is_empty(), "layering violations:\n{}", violations.join("\n"));
}

#[test]
fn top_level_modules_form_no_cycle() {
    let graph = import_graph();
    // Kahn's algorithm: whatever cannot be ordered lies on a cycle.
    let mut indegree: BTreeMap<&str, usize> = graph.keys().map(|m| (m.as_str(), 0)).collect();
    for imports in graph.values() {
        for i in imports {
            if let Some(d) = indegree.get_mut(i.as_str()) {
                *d += 1;
            }
        }
    }
    let mut ready: Vec<&str> = indegree.iter().filter(|(_, d)| **d == 0).map(|(m, _)| *m).collect();
    let mut ordered = 0;
    while let Some(m) = ready.pop() {
        ordered += 1;
        for i in &graph[m] {
            if let Some(d) = indegree.get_mut(i.as_str()) {
                *d -= 1;
                if *d == 0 {
                    ready.push(i.as_str());
                }
            }
        }
    }
    let cyclic: Vec<&str> = indegree.iter().filter(|(_, d)| **d > 0).map(|(m, _)| *m).collect();
    assert_eq!(ordered, graph.len(), "import cycle among: {cyclic:?}");
}

#[test]
fn the_scanner_sees_paths_and_skips_comments() {
    let refs =
        crate_references("use crate::config::Settings; // crate::relay\nlet x = crate::ops::units::human_bytes(1);");
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        vec!["config".to_owned(), "ops".to_owned()]
    );
}

/// `docs/architecture.md` is the map newcomers read first: every file and folder it names under
/// `src/` must exist.
#[test]
fn the_architecture_page_names_only_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).expect("read docs/architecture.md");
    let mut named = BTreeSet::new();
    let mut rest = page.as_str();
    while let Some(at) = rest.find("src/") {
        let path: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '.' | '-'))
            .collect();
        named.insert(path.trim_end_matches('.').to_owned());
        rest = &rest[at + 4..];
    }
    assert!(
        named.len() > 20,
        "expected the page to name the files of each step, found {named:?}"
    );
    let missing: Vec<&String> = named.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names files that do not exist: {missing:?}"
    );
}

/// Whether the page names `file` (`src/relay/outage.rs`): by its path, or by its backticked
/// name on a line that names its folder (a row of the Files table: `src/relay/` … `outage.rs`).
fn page_names_file(page: &str, file: &str) -> bool {
    let (folder, name) = file.rsplit_once('/').expect("a path under src/");
    page.contains(file)
        || page
            .lines()
            .any(|line| line.contains(&format!("`{folder}/`")) && line.contains(&format!("`{name}`")))
}

/// The other direction: every file under `src/` is on the page (unit-test files called
/// `tests.rs` aside), so a new file cannot go unmapped — the page's Files table lists each in
/// its folder's row.
#[test]
fn the_architecture_page_names_every_source_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).expect("read docs/architecture.md");
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(files.len() > 100, "found too few source files: {files:?}");
    let missing: Vec<String> = files
        .iter()
        .map(|f| {
            f.strip_prefix(root)
                .expect("under the repository")
                .to_string_lossy()
                .into_owned()
        })
        .filter(|f| !f.ends_with("/tests.rs") && !page_names_file(&page, f))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name these files (add each to its folder's row of the Files table): {missing:?}"
    );
}

/// A registered sink: its `[sink] kind` word and module name (`sqs`), and its folder under
/// `src/sink/` (`aws/sqs`: a sink of a family lives in the family's folder).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RegisteredSink {
    name: String,
    folder: String,
}

impl RegisteredSink {
    /// Its folder's path from the repository's root, with a trailing `/`.
    fn dir(&self) -> String {
        format!("src/sink/{}/", self.folder)
    }

    /// The family folder it lives in (`aws`), if any.
    fn family(&self) -> Option<&str> {
        self.folder.rsplit_once('/').map(|(family, _)| family)
    }
}

/// The sinks registered in `src/sink/registry.rs` (`sinks![crate::sink::<name>::<Plugin>, …]`,
/// or `crate::sink::<family>::<name>::<Plugin>`), in registration order.
fn registered_sinks(root: &Path) -> Vec<RegisteredSink> {
    let registry = std::fs::read_to_string(root.join("src/sink/registry.rs")).expect("read src/sink/registry.rs");
    let list = registry
        .split("\nsinks![")
        .nth(1)
        .and_then(|rest| rest.split("];").next())
        .expect("the sinks![…] list in src/sink/registry.rs");
    list.lines()
        .filter_map(|l| l.trim().trim_end_matches(',').strip_prefix("crate::sink::"))
        .filter_map(|l| l.rsplit_once("::").map(|(modules, _plugin)| modules))
        .map(|modules| RegisteredSink {
            name: modules.rsplit("::").next().unwrap_or(modules).to_owned(),
            folder: modules.replace("::", "/"),
        })
        .collect()
}

/// The folders directly under `dir`, by name.
fn folders(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let path = e.expect("dir entry").path();
            path.is_dir()
                .then(|| path.file_name().unwrap().to_string_lossy().into_owned())
        })
        .collect()
}

/// A sink is one folder (its section `config.rs` inside) and one line in the registry
/// (`src/sink/registry.rs`: the config half is the plugin's `spec`, handed to the loader from
/// there), as docs/architecture.md ("Adding a sink") says: every registered sink has exactly
/// those, every folder under `src/sink/` is a registered sink or a family of them (`aws/`, whose
/// folders are all registered sinks), the configuration keeps no list of sinks and no section of
/// one (no `src/config/<name>.rs`), and the page lists each sink's folder.
#[test]
fn every_sink_is_a_folder_with_its_config_section_and_one_registration() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("read {p}: {e}"));
    let sinks = registered_sinks(root);
    assert!(
        sinks.len() >= 4,
        "parsed too few sinks from src/sink/registry.rs: {sinks:?}"
    );
    let mut config_files = Vec::new();
    rust_files(&root.join("src/config"), &mut config_files);
    for file in &config_files {
        let text = std::fs::read_to_string(file).expect("read source");
        let listed: Vec<&str> = text
            .lines()
            .filter(|l| {
                let l = l.trim();
                l.starts_with("&crate::") && l.ends_with("::SECTION,")
            })
            .collect();
        assert!(
            listed.is_empty(),
            "{} lists sink sections ({listed:?}): the registry (src/sink/registry.rs) is the only list of sinks",
            file.display()
        );
    }
    let families: BTreeSet<&str> = sinks.iter().filter_map(RegisteredSink::family).collect();
    let top: BTreeSet<String> = sinks
        .iter()
        .map(|s| s.family().unwrap_or(&s.folder).to_owned())
        .collect();
    assert_eq!(
        folders(&root.join("src/sink")),
        top,
        "every folder under src/sink/ is a registered sink or a family of them, and every registered sink a folder"
    );
    for family in &families {
        let members: BTreeSet<String> = sinks
            .iter()
            .filter(|s| s.family() == Some(*family))
            .map(|s| s.name.clone())
            .collect();
        assert_eq!(
            folders(&root.join("src/sink").join(family)),
            members,
            "every folder under src/sink/{family}/ is a registered sink"
        );
        assert!(
            root.join("src/sink").join(family).join("mod.rs").exists(),
            "no src/sink/{family}/mod.rs"
        );
    }
    let page = read("docs/architecture.md");
    let adding = page
        .split("### Adding a sink")
        .nth(1)
        .expect("docs/architecture.md: \"### Adding a sink\"");
    for needle in [
        "src/sink/<name>/",
        "src/sink/<name>/config.rs",
        "src/sink/registry.rs",
        "sinks![",
    ] {
        assert!(adding.contains(needle), "\"Adding a sink\" does not say {needle}");
    }
    for sink in &sinks {
        let (name, dir) = (&sink.name, sink.dir());
        assert!(root.join(&dir).join("mod.rs").exists(), "no {dir}mod.rs");
        assert!(
            root.join(&dir).join("config.rs").exists(),
            "no {dir}config.rs: a sink's section lives in its folder"
        );
        assert!(
            !root.join("src/config").join(format!("{name}.rs")).exists(),
            "src/config/{name}.rs: a sink's section lives in its folder ({dir}config.rs)"
        );
        assert!(page.contains(&dir), "docs/architecture.md does not list {dir}");
    }
}

/// A line of Rust with its comment cut off (`//` outside a string literal); string literals
/// are kept, since a kind written as a literal is what the sink test looks for.
fn without_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    let (mut i, mut in_string) = (0, false);
    while i < bytes.len() {
        match (in_string, bytes[i]) {
            (true, b'\\') => i += 1,
            (true, b'"') => in_string = false,
            (false, b'"') => in_string = true,
            (false, b'/') if bytes.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
        i += 1;
    }
    line
}

/// The code lines of a source file, numbered from 1: comments cut off, and unit-test code left
/// out (an item under `#[cfg(test)]` at the top level, to its closing `}`): tests exercise
/// concrete sinks by necessity, and are not what the relay runs.
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|l| l.trim_end().ends_with('{')) {
            i += 2;
            while i < lines.len() && lines[i] != "}" {
                i += 1;
            }
            i += 1;
            continue;
        }
        out.push((i + 1, without_comment(lines[i])));
        i += 1;
    }
    out
}

/// Whether `code` names `word` as a path segment (`word::`, `::word`, `mod word`), not as part
/// of a longer identifier.
fn names_segment(code: &str, word: &str) -> bool {
    let ident = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    code.match_indices(word).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = &code[at + word.len()..];
        if ident(before) || ident(after.chars().next()) {
            return false;
        }
        after.starts_with("::") || code[..at].ends_with("::") || code[..at].ends_with("mod ")
    })
}

/// Whether `code` uses crate `name` by path (`lapin::…`), not as the end of another path.
fn names_crate(code: &str, name: &str) -> bool {
    code.match_indices(&format!("{name}::")).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    })
}

/// The client crates named in the log targets declared in `dir`'s files (`target: "lapin"`,
/// `ClientLogTarget::debug("lapin")`, `ClientLogTarget::at("lapin", …)`), by their top-level
/// name.
fn declared_crates(dir: &Path, skip: &[PathBuf]) -> BTreeSet<String> {
    let mut crates = BTreeSet::new();
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    for file in files.iter().filter(|f| !skip.iter().any(|s| f.starts_with(s))) {
        let text = std::fs::read_to_string(file).expect("read source");
        for (_, code) in code_lines(&text) {
            for marker in ["target: \"", "ClientLogTarget::debug(\"", "ClientLogTarget::at(\""] {
                for rest in code.split(marker).skip(1) {
                    let krate: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !krate.is_empty() {
                        crates.insert(krate);
                    }
                }
            }
        }
    }
    crates
}

/// A new destination is one folder: outside `src/sink/<name>/` (its section included) and the
/// registry (`src/sink/registry.rs`, whose first line is also the default `[sink] kind`), no
/// source file names a specific sink in code — its `[sink] kind` as a string literal, its module
/// (`kafka::`, `sink::nats`, `mod redis`), or its client crate (the crates whose log targets its
/// plugin declares: `rdkafka`, `async_nats`, `lapin`, `redis`). A family of sinks (`aws/`, with
/// `sqs/`, `sns/` and `kinesis/` inside) shares files outside its sinks' folders: they name the
/// client crates the family declares (the AWS SDK's configuration chain) but no sink. The only
/// other lines allowed are the `mod <name>;` declarations in `src/sink/mod.rs` and in a family's
/// `mod.rs`. Excepted as the issue allows: the Debezium import mapping
/// (`src/control/import_debezium/`, which translates Debezium's sink names). The demo is no
/// exception: each sink's demo half (its consumer, its server, its section) lives in the sink's
/// folder, and `src/demo/` asks the plugins. Comments and unit tests are not code the relay runs
/// (see [`code_lines`]).
#[test]
fn no_source_file_outside_a_sink_names_that_sink() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let sinks = registered_sinks(root);
    assert!(sinks.len() >= 4, "found too few sinks: {sinks:?}");
    let families: BTreeSet<&str> = sinks.iter().filter_map(RegisteredSink::family).collect();
    let sink_dirs: Vec<PathBuf> = sinks.iter().map(|s| root.join(s.dir())).collect();
    // A sink's client crates: the top-level names of the log targets its plugin declares; a
    // family's: those its shared files declare.
    let mut crates: BTreeSet<String> = BTreeSet::new();
    for dir in &sink_dirs {
        crates.extend(declared_crates(dir, &[]));
    }
    let family_crates: BTreeMap<&str, BTreeSet<String>> = families
        .iter()
        .map(|f| (*f, declared_crates(&src.join("sink").join(f), &sink_dirs)))
        .collect();
    crates.extend(family_crates.values().flatten().cloned());
    assert!(
        ["rdkafka", "async_nats", "lapin", "redis", "aws_sdk_sqs", "aws_config"]
            .iter()
            .all(|c| crates.contains(*c)),
        "the plugins' log targets should name their client crates, found {crates:?}"
    );
    let own = |relative: &str| sinks.iter().any(|s| relative.starts_with(&s.dir()));
    let family_of = |relative: &str| {
        families
            .iter()
            .copied()
            .find(|f| relative.starts_with(&format!("src/sink/{f}/")))
    };
    let excepted = ["src/sink/registry.rs"];
    let excepted_dirs = ["src/control/import_debezium/"];
    let mut declarations = vec!["src/sink/mod.rs".to_owned()];
    declarations.extend(families.iter().map(|f| format!("src/sink/{f}/mod.rs")));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        if own(&relative)
            || relative.ends_with("/tests.rs")
            || excepted.contains(&relative.as_str())
            || excepted_dirs.iter().any(|d| relative.starts_with(d))
        {
            continue;
        }
        let shared = family_of(&relative).map(|f| &family_crates[f]);
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, code) in code_lines(&text) {
            let mut named = Vec::new();
            for RegisteredSink { name, .. } in &sinks {
                let declaration = declarations.contains(&relative) && code.trim() == format!("pub(crate) mod {name};");
                if code.contains(&format!("\"{name}\"")) {
                    named.push(format!("the kind \"{name}\""));
                }
                if !declaration && names_segment(code, name) {
                    named.push(format!("the module {name}"));
                }
            }
            for krate in &crates {
                if !shared.is_some_and(|c| c.contains(krate)) && names_crate(code, krate) {
                    named.push(format!("the client crate {krate}"));
                }
            }
            if !named.is_empty() {
                violations.push(format!("{relative}:{n}: {} in: {}", named.join(", "), code.trim()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "sinks named outside their folder and registration (reach them through the sink's \
         plugin instead):\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_sink_scanner_sees_code_and_skips_comments_and_tests() {
    let text =
        "let a = \"kafka\"; // \"nats\"\nuse lapin::Channel;\n#[cfg(test)]\nmod tests {\n    \"redis\"\n}\nlet b = 1;";
    let lines = code_lines(text);
    assert_eq!(lines.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1, 2, 7]);
    assert_eq!(lines[0].1, "let a = \"kafka\"; ");
    assert!(names_crate(lines[1].1, "lapin"));
    assert!(!names_crate("crate::sink::redis::config::X", "redis"));
    assert!(names_segment("crate::sink::redis::config::X", "redis"));
    assert!(names_segment("pub(crate) mod nats;", "nats"));
    assert!(!names_segment("let nats_url = 1;", "nats"));
    assert_eq!(without_comment("let u = \"nats://h\"; // x"), "let u = \"nats://h\"; ");
}

/// Brokers are adapters behind one publish interface: outside `src/sink/`, no file names a
/// broker's folder (`sink::kafka`, `sink::aws`, …); the relay, poll, control and the domain
/// see only `sink::Sink`, `sink::ReadBack` and the other neutral types of `src/sink/mod.rs`.
#[test]
fn no_file_outside_the_sinks_names_a_broker_adapter() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let kinds = folders(&src.join("sink"));
    assert!(kinds.len() >= 4, "found too few sink folders: {kinds:?}");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in files.iter().filter(|f| !f.starts_with(src.join("sink"))) {
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for kind in &kinds {
                if code.contains(&format!("sink::{kind}::")) || code.contains(&format!("sink::{kind};")) {
                    violations.push(format!(
                        "{}:{}: {}",
                        file.strip_prefix(root).unwrap().display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "broker adapters named outside src/sink/:\n{}",
        violations.join("\n")
    );
}

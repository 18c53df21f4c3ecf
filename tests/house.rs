//! The house rules, checked: no source file over 450 lines and no function
//! over 120, outside tests. Counted on the parsed source (`syn`), so braces
//! inside strings and comments count for nothing; `#[cfg(test)]` items and
//! the `tests/`, `benches/` and `examples/` folders are left out.

use std::path::{Path, PathBuf};
use syn::spanned::Spanned;
use syn::visit::Visit;

const MAX_FILE_LINES: usize = 450;
const MAX_FN_LINES: usize = 120;

/// Every `.rs` file of the workspace's sources.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let skipped = ["target", "tests", "benches", "examples", "node_modules"];
        if path.is_dir() {
            if !name.starts_with('.') && !skipped.contains(&name.as_str()) {
                sources(&path, out);
            }
        } else if name.ends_with(".rs")
            && !["tests.rs", "testing.rs", "build.rs"].contains(&name.as_str())
        {
            out.push(path);
        }
    }
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| {
                let tokens = l.tokens.to_string();
                tokens == "test" || tokens.starts_with("test,") || tokens.contains("any(test")
            })
    })
}

fn lines(span: proc_macro2::Span) -> usize {
    span.end().line - span.start().line + 1
}

/// The functions over the limit, and the lines test items take.
#[derive(Default)]
struct Measure {
    long_fns: Vec<(String, usize)>,
    test_lines: usize,
}

impl Measure {
    fn function(&mut self, name: &syn::Ident, span: proc_macro2::Span) {
        let n = lines(span);
        if n > MAX_FN_LINES {
            self.long_fns.push((name.to_string(), n));
        }
    }
}

impl<'ast> Visit<'ast> for Measure {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test(attrs) {
            self.test_lines += lines(item.span());
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.function(&f.sig.ident, f.span());
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            self.function(&f.sig.ident, f.span());
        }
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        self.function(&f.sig.ident, f.span());
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn no_source_file_over_450_lines_and_no_function_over_120() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(root, &mut files);
    files.sort();
    assert!(files.len() > 100, "found only {} sources", files.len());
    let mut broken = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut measure = Measure::default();
        measure.visit_file(&parsed);
        let shown = path.strip_prefix(root).unwrap().display();
        let file_lines = text.lines().count() - measure.test_lines;
        if file_lines > MAX_FILE_LINES {
            broken.push(format!("{shown}: {file_lines} lines"));
        }
        for (name, n) in measure.long_fns {
            broken.push(format!("{shown}: fn {name} is {n} lines"));
        }
    }
    assert!(
        broken.is_empty(),
        "over the house limits ({MAX_FILE_LINES} lines a file, {MAX_FN_LINES} a function, outside tests):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_measure_sees_a_long_function_and_not_the_braces_in_strings() {
    let body = "    let x = 1;\n".repeat(MAX_FN_LINES);
    let text = format!(
        "fn short() {{ let s = \"}}}}}}\"; }}\nfn long() {{\n{body}}}\n#[cfg(test)]\nmod tests {{\nfn t() {{\n{body}}}\n}}\n"
    );
    let mut measure = Measure::default();
    measure.visit_file(&syn::parse_file(&text).unwrap());
    assert_eq!(measure.long_fns, [("long".to_string(), MAX_FN_LINES + 2)]);
    // The test module's long function is the test module's.
    assert_eq!(measure.test_lines, MAX_FN_LINES + 5);
}

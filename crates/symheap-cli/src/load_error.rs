//! A failed library search (NVRTC, ...) said in one line for `symheap info`, and in full for
//! `symheap info --verbose`.
//!
//! Why here and not in the runtime: the runtime's error names every place it looked, which is
//! what a program's log needs, but on a machine without a GPU `symheap info` printed that as a
//! line of about 1,000 characters per PE for a library it does not need there. The error's text
//! (`cannot load FILE; looked in: PATH (ORIGIN): WHY; ... (NOTE). Set VAR ..., or `pip install
//! WHEEL` ...`) is read back here; a text of another shape is cut to the line budget, never
//! printed whole.

/// One place the search tried.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Place {
    /// The file (or bare loader name) tried.
    pub(crate) path: String,
    /// Where it came from: a variable, `the ... Python package`, `the dynamic loader's ...`.
    pub(crate) origin: String,
    /// Why it was not used.
    pub(crate) why: String,
}

/// A library search error read back into its parts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LoadError {
    /// The library looked for, e.g. `libnvrtc.so.13`.
    pub(crate) file: String,
    /// Every place tried, in order.
    pub(crate) places: Vec<Place>,
    /// The search's note (e.g. why there were no Python directories), if any.
    pub(crate) note: Option<String>,
    /// The variable that names the library, e.g. `SYMHEAP_NVRTC_LIB`.
    pub(crate) var: Option<String>,
    /// What to `pip install`, e.g. `nvidia-cuda-nvrtc`.
    pub(crate) wheel: Option<String>,
}

/// Whether `why` only says the file is not there (the usual, uninteresting case).
fn absent(why: &str) -> bool {
    why == "no such file" || why.contains("No such file or directory")
}

/// `s` without its last parenthesised group (` (...)`, nested parentheses allowed) and the
/// group's text, when `s` ends with one.
fn trailing_group(s: &str) -> Option<(&str, &str)> {
    let body = s.strip_suffix(')')?;
    let mut depth = 0usize;
    for (i, c) in body.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' if depth > 0 => depth -= 1,
            '(' => return body[..i].strip_suffix(' ').map(|t| (t, &body[i + 1..])),
            _ => {}
        }
    }
    None
}

fn place(s: &str) -> Option<Place> {
    let close = s.find("): ")?;
    let open = s[..close].rfind(" (")?;
    Some(Place {
        path: s[..open].to_string(),
        origin: s[open + 2..close].to_string(),
        why: s[close + 3..].to_string(),
    })
}

impl LoadError {
    /// Reads `e` back into its parts; `None` when it has another shape.
    pub(crate) fn parse(e: &str) -> Option<LoadError> {
        let rest = e.strip_prefix("cannot load ")?;
        let (file, rest) = rest.split_once("; looked in: ")?;
        let (tried, hint) = match rest.rfind(". Set ") {
            Some(i) => (&rest[..i], &rest[i + 2..]),
            None => (rest, ""),
        };
        let (tried, note) = match trailing_group(tried) {
            // A note follows the last place only when that place's reason ends before it.
            Some((t, n)) if place(t.rsplit("; ").next().unwrap_or(t)).is_some() => {
                (t, Some(n.to_string()))
            }
            _ => (tried, None),
        };
        let places = tried.split("; ").map(place).collect::<Option<Vec<_>>>()?;
        let var = hint
            .strip_prefix("Set ")
            .and_then(|h| h.split_whitespace().next())
            .map(str::to_string);
        let wheel = hint
            .split_once("`pip install ")
            .and_then(|(_, w)| w.split_once('`'))
            .map(|(w, _)| w.to_string());
        Some(LoadError {
            file: file.to_string(),
            places,
            note,
            var,
            wheel,
        })
    }

    /// Where it looked, said briefly after the library's name: a place the user named (a
    /// variable) or one that failed for a reason other than absence in full, the rest counted
    /// by kind (`not in 4 Python dirs, toolkit, loader path`).
    fn places_brief(&self) -> String {
        // A Python directory tried for several packages (libnvrtc.so.13 of the cu13 wheel and
        // .so.12 of the cu12 one) counts once: the site directory before `/nvidia/`.
        let mut dirs = std::collections::BTreeSet::new();
        let (mut loader, mut toolkit, mut named) = (false, false, Vec::new());
        for p in &self.places {
            if p.origin.contains("Python package") && absent(&p.why) {
                let site = p
                    .path
                    .split_once("/nvidia/")
                    .map_or(p.path.as_str(), |(d, _)| d);
                dirs.insert(site);
            } else if p.origin.contains("CUDA toolkit") && absent(&p.why) {
                toolkit = true;
            } else if p.origin.contains("loader") && absent(&p.why) {
                loader = true;
            } else {
                named.push(format!("{} ({}): {}", p.path, p.origin, p.why));
            }
        }
        let python = dirs.len();
        let mut kinds = Vec::new();
        if python > 0 {
            let s = if python == 1 { "" } else { "s" };
            kinds.push(format!("{python} Python dir{s}"));
        }
        if toolkit {
            kinds.push("toolkit".to_string());
        }
        if loader {
            kinds.push("loader path".to_string());
        }
        let counted = (!kinds.is_empty()).then(|| format!("not in {}", kinds.join(", ")));
        match (named.is_empty(), counted) {
            (true, Some(c)) => format!(" {c}"),
            (_, c) => format!(
                ": {}",
                named.into_iter().chain(c).collect::<Vec<_>>().join("; ")
            ),
        }
    }

    /// How to fix it, e.g. ``pip install nvidia-cuda-nvrtc` or set SYMHEAP_NVRTC_LIB``.
    fn hint(&self) -> Option<String> {
        match (&self.wheel, &self.var) {
            (Some(w), Some(v)) => Some(format!("pip install {w} or set {v}")),
            (Some(w), None) => Some(format!("pip install {w}")),
            (None, Some(v)) => Some(format!("set {v}")),
            (None, None) => None,
        }
    }
}

/// Cuts `s` to at most `max` characters, marking the cut.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Alternative names of one library said once: `libnvrtc.so.13 or libnvrtc.so.12` is
/// `libnvrtc.so.13/12` (the line has room for the places and the fix then).
fn compact_names(file: &str) -> String {
    let names: Vec<&str> = file.split(" or ").collect();
    let Some((first, rest)) = names.split_first() else {
        return file.to_string();
    };
    let stem = first.rfind('.').map_or("", |i| &first[..=i]);
    if stem.is_empty() || rest.is_empty() || !rest.iter().all(|n| n.starts_with(stem)) {
        return file.to_string();
    }
    let tails: Vec<&str> = rest.iter().map(|n| &n[stem.len()..]).collect();
    format!("{first}/{}", tails.join("/"))
}

/// `what` (e.g. `NVRTC`) could not be loaded because of `e`: one line of at most `max`
/// characters (unless a path the user named is longer) naming the library, where it was looked
/// for and the fix, and pointing at `more` (e.g. `symheap info -v`) for every place.
pub(crate) fn one_line(what: &str, e: &str, max: usize, more: &str) -> String {
    let Some(le) = LoadError::parse(e) else {
        return cut(&format!("{what} not found: {e}"), max);
    };
    // The library's own name says what it is when it contains `what` (libnvrtc: NVRTC).
    let file = compact_names(&le.file);
    let head = if file.contains(&what.to_ascii_lowercase()) {
        file
    } else {
        format!("{what}: {file}")
    };
    let mut parts = vec![format!("{head}{}", le.places_brief())];
    let hint = le.hint();
    parts.extend(hint.clone());
    let full = parts.join("; ");
    let with_more = format!("{full} ({more}: every place)");
    let short = [format!("{head} not found")]
        .into_iter()
        .chain(hint)
        .collect::<Vec<_>>()
        .join("; ");
    let fits = |c: &String| c.chars().count() <= max;
    if fits(&with_more) {
        with_more
    } else if fits(&full) {
        full
    } else if le.places.iter().filter(|p| !absent(&p.why)).count() == 1
        || (le.places.len() == 1 && !le.places[0].origin.contains("loader"))
    {
        // One place that failed for a reason of its own, or the one a variable named: that
        // place is the story (often the user's typo), worth a longer line.
        full
    } else {
        cut(&short, max)
    }
}

/// Every place the search looked, one per line, for `--verbose`.
pub(crate) fn places(e: &str) -> Vec<String> {
    match LoadError::parse(e) {
        Some(le) => le
            .places
            .iter()
            .map(|p| format!("{} ({}): {}", p.path, p.origin, p.why))
            .chain(le.note)
            .collect(),
        None => vec![e.to_string()],
    }
}

#[cfg(test)]
mod compact_tests {
    use super::compact_names;

    #[test]
    fn alternative_names_of_one_library_are_said_once() {
        assert_eq!(
            compact_names("libnvrtc.so.13 or libnvrtc.so.12"),
            "libnvrtc.so.13/12"
        );
        assert_eq!(compact_names("libnvrtc.so.13"), "libnvrtc.so.13");
        assert_eq!(
            compact_names("liba.so.1 or libb.so.2"),
            "liba.so.1 or libb.so.2"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HINT: &str = ". Set SYMHEAP_NVRTC_LIB to the library (or its directory), or `pip \
                        install nvidia-cuda-nvrtc` (found through the Python search path)";

    fn search(dirs: usize, loader_why: &str) -> String {
        let mut tried: Vec<String> = (0..dirs)
            .map(|i| {
                format!(
                    "/home/someone/.pyenv/versions/3.11.{i}/lib/python3.11/site-packages/nvidia/\
                     cu13/lib/libnvrtc.so.13 (the nvidia-cuda-nvrtc Python package): no such file"
                )
            })
            .collect();
        tried.push(format!(
            "libnvrtc.so.13 (the dynamic loader's search path): {loader_why}"
        ));
        format!(
            "cannot load libnvrtc.so.13; looked in: {}{HINT}",
            tried.join("; ")
        )
    }

    const DL_ABSENT: &str = "dlopen failed: libnvrtc.so.13: cannot open shared object file: No \
                             such file or directory";

    #[test]
    fn the_usual_miss_is_one_short_line_with_what_where_and_the_fix() {
        for dirs in [0, 1, 4, 40] {
            let e = search(dirs, DL_ABSENT);
            let line = one_line("NVRTC", &e, 115, "symheap info -v");
            assert!(line.chars().count() <= 115, "{dirs}: {line}");
            assert!(line.contains("libnvrtc.so.13"), "{line}");
            assert!(line.contains("loader path"), "{line}");
            assert!(
                line.contains("pip install nvidia-cuda-nvrtc or set SYMHEAP_NVRTC_LIB"),
                "{line}"
            );
            if dirs > 0 {
                let s = if dirs == 1 { "" } else { "s" };
                assert!(line.contains(&format!("{dirs} Python dir{s}")), "{line}");
            }
            assert_eq!(places(&e).len(), dirs + 1);
        }
    }

    #[test]
    fn a_place_that_failed_for_another_reason_is_named() {
        let e = search(2, "libnvrtc.so.13: wrong ELF class: ELFCLASS32");
        let line = one_line("NVRTC", &e, 150, "info -v");
        assert!(line.contains("wrong ELF class"), "{line}");
        assert!(line.contains("not in 2 Python dirs"), "{line}");
    }

    #[test]
    fn a_wrong_variable_is_named_whole() {
        let e = format!(
            "cannot load libnvrtc.so.13; looked in: /nonexistent/libnvrtc.so.13 \
             (SYMHEAP_NVRTC_LIB): no such file{HINT}"
        );
        let le = LoadError::parse(&e).unwrap();
        assert_eq!(le.var.as_deref(), Some("SYMHEAP_NVRTC_LIB"));
        assert_eq!(le.wheel.as_deref(), Some("nvidia-cuda-nvrtc"));
        let line = one_line("NVRTC", &e, 116, "symheap info -v");
        assert!(
            line.contains("/nonexistent/libnvrtc.so.13 (SYMHEAP_NVRTC_LIB): no such file"),
            "{line}"
        );
    }

    #[test]
    fn the_note_is_kept_apart_from_the_last_place() {
        let e = format!(
            "cannot load libnvrtc.so.13; looked in: libnvrtc.so.13 (the dynamic loader's search \
             path): {DL_ABSENT} (no python3 to ask for its site-packages (not found)){HINT}"
        );
        let le = LoadError::parse(&e).unwrap();
        assert_eq!(le.places.len(), 1);
        assert_eq!(le.places[0].why, DL_ABSENT);
        assert_eq!(
            le.note.as_deref(),
            Some("no python3 to ask for its site-packages (not found)")
        );
    }

    #[test]
    fn another_shape_is_cut_not_printed_whole() {
        let e = "x".repeat(1000);
        let line = one_line("NVRTC", &e, 100, "info -v");
        assert_eq!(line.chars().count(), 100);
        assert!(line.ends_with('…'));
        assert_eq!(places(&e), vec![e.clone()]);
    }
}

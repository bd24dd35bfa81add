//! Namespaces: which ones an operator serves, from the `-n` patterns, with Kopf's rules
//! (`reference/kopf.md` §1.11, Kopf's `match_namespace` and `select_specific_namespaces`).
//!
//! A pattern is a comma-separated list of globs (`*`, `?`, `[abc]`, `[!abc]`, `[a-z]`, as Python's
//! `fnmatch`); a glob starting with `!` excludes. `-n` may be repeated: a namespace is served if any
//! pattern matches it.

use std::fmt;

/// The `-n` patterns of an operator: which namespaces it serves, as in Kopf.
///
/// **Expected flow**
/// 1. [`parse`](Self::parse) the `-n` values at startup (an invalid one stops the operator with a
///    one-line [`PatternError`]).
/// 2. If [`exact_names`](Self::exact_names) is `Some`, serve exactly those namespaces; otherwise
///    list and watch `v1/namespaces` and serve those that [`matches`](Self::matches) accepts.
///
/// **Guarantees**
/// One pattern matches a name as Kopf's `match_namespace` does:
/// * the first glob decides; a leading negation implies `*` before it (`!kube-*` is `*,!kube-*`);
/// * a later `!glob` excludes what it matches;
/// * a later inclusion re-includes what it matches, but **only names the first glob matched**: in
///   `myapp-*,!*-pr-*,*-pr-123`, the last glob brings back `myapp-pr-123`, never `other-pr-123`.
///
/// Several patterns are alternatives: a namespace is served if any of them matches it.
///
/// **Caveats**
/// Because of the rule on later inclusions, `-n ns1,ns2` serves `ns1` only (as in Kopf); serving both
/// needs `-n ns1 -n ns2`. [`parse`](Self::parse) warns about such globs, which can never have an
/// effect. Kopf's regular-expression patterns (possible only through its Python API) are not
/// supported.
///
/// ```
/// use kactor_reactor::namespaces::NamespacePatterns;
///
/// let patterns = NamespacePatterns::parse(&["!kube-*,kube-public".to_string()]).unwrap();
/// assert!(patterns.matches("default"));
/// assert!(patterns.matches("kube-public"));
/// assert!(!patterns.matches("kube-system"));
/// assert_eq!(patterns.exact_names(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespacePatterns {
    patterns: Vec<Pattern>,
}

/// Why a `-n` pattern is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// No pattern at all: serving no namespace is never what is meant.
    #[error(
        "no namespace pattern given; pass -n NAMESPACE (a name or a glob such as \"team-*\"), or -A to \
         serve the whole cluster"
    )]
    NoPatterns,
    /// A pattern that is empty or only whitespace.
    #[error(
        "the namespace pattern {pattern:?} is empty; pass a namespace name or a glob such as \"team-*\""
    )]
    Empty {
        /// The pattern as given.
        pattern: String,
    },
    /// A glob that is empty: two commas in a row, a trailing comma, or a lone `!`.
    #[error(
        "the namespace pattern {pattern:?} has an empty glob (between two commas, at an end, or after \
         \"!\"); remove the extra comma or complete the glob"
    )]
    EmptyGlob {
        /// The pattern as given.
        pattern: String,
    },
    /// A `[` that no `]` closes. (Python's `fnmatch`, which Kopf uses, would take it literally, and
    /// then it could never match: namespace names have no `[`.)
    #[error(
        "the namespace pattern {pattern:?} has an invalid glob {glob:?}: its \"[\" is never closed by \
         \"]\"; write a character class such as \"[ab]-*\""
    )]
    UnclosedBracket {
        /// The pattern as given.
        pattern: String,
        /// The glob with the `[`.
        glob: String,
    },
}

impl NamespacePatterns {
    /// Parses `-n` values, one pattern each.
    ///
    /// Whitespace around each glob is ignored (as in Kopf). An empty list, an empty pattern, an empty
    /// glob and an unclosed `[` are errors. A later inclusion that can have no effect (no exclusion
    /// before it, as the second glob of `ns1,ns2`) is accepted, as Kopf does, with a warning.
    pub fn parse(patterns: &[String]) -> Result<Self, PatternError> {
        if patterns.is_empty() {
            return Err(PatternError::NoPatterns);
        }
        let patterns = patterns
            .iter()
            .map(|text| Pattern::parse(text))
            .collect::<Result<Vec<_>, _>>()?;
        for pattern in &patterns {
            pattern.warn_about_dead_globs();
        }
        Ok(NamespacePatterns { patterns })
    }

    /// Whether the namespace `name` is served: whether any pattern matches it.
    pub fn matches(&self, name: &str) -> bool {
        self.patterns.iter().any(|pattern| pattern.matches(name))
    }

    /// The namespaces to serve when the patterns name them all: `Some` when every glob of every
    /// pattern is a plain name (no wildcard, no class, no negation). The operator then serves exactly
    /// these, with no need to list and watch namespaces (as Kopf does for plain names).
    ///
    /// Each pattern contributes its first name only: the later names of `ns1,ns2` can never match
    /// (see the caveats on [`NamespacePatterns`]). Names are unique, in the order given.
    pub fn exact_names(&self) -> Option<Vec<String>> {
        let mut names: Vec<String> = Vec::new();
        for pattern in &self.patterns {
            if pattern
                .globs
                .iter()
                .any(|glob| glob.negated || !glob.is_plain())
            {
                return None;
            }
            let first = &pattern.globs.first()?.text;
            if !names.contains(first) {
                names.push(first.clone());
            }
        }
        Some(names)
    }
}

impl fmt::Display for NamespacePatterns {
    /// The patterns as given, each quoted, for logs: `"kube-*", "default"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<String> = self
            .patterns
            .iter()
            .map(|p| format!("{:?}", p.text))
            .collect();
        f.write_str(&texts.join(", "))
    }
}

/// One `-n` value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    /// As given, for messages.
    text: String,
    /// Never empty, and the first is an inclusion (a leading negation gets an implied `*`).
    globs: Vec<Glob>,
}

impl Pattern {
    fn parse(text: &str) -> Result<Self, PatternError> {
        if text.trim().is_empty() {
            return Err(PatternError::Empty {
                pattern: text.to_string(),
            });
        }
        let mut globs = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let (negated, glob) = match part.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, part),
            };
            if glob.is_empty() {
                return Err(PatternError::EmptyGlob {
                    pattern: text.to_string(),
                });
            }
            let tokens = compile(glob).ok_or_else(|| PatternError::UnclosedBracket {
                pattern: text.to_string(),
                glob: part.to_string(),
            })?;
            globs.push(Glob {
                negated,
                text: glob.to_string(),
                tokens,
            });
        }
        if globs.first().is_some_and(|glob| glob.negated) {
            globs.insert(
                0,
                Glob {
                    negated: false,
                    text: "*".to_string(),
                    tokens: vec![Token::AnyMany],
                },
            );
        }
        Ok(Pattern {
            text: text.to_string(),
            globs,
        })
    }

    /// Kopf's `match_namespace`.
    fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        let mut globs = self.globs.iter();
        let first_match = globs.next().is_some_and(|glob| glob.matches(&name));
        let mut result = first_match;
        for glob in globs {
            if glob.negated {
                result = result && !glob.matches(&name);
            } else {
                result = result || (first_match && glob.matches(&name));
            }
        }
        result
    }

    /// A later inclusion with no exclusion before it can only re-include what is already included.
    fn warn_about_dead_globs(&self) {
        let mut excluded_before = false;
        for glob in self.globs.iter().skip(1) {
            if glob.negated {
                excluded_before = true;
            } else if !excluded_before {
                tracing::warn!(
                    pattern = %self.text,
                    glob = %glob.text,
                    "Namespace glob {:?} in {:?} has no effect: as in Kopf, globs after the first only \
                     re-include namespaces that the first glob matched and a negation excluded; pass it \
                     as a separate pattern (-n {:?}) to serve it.",
                    glob.text,
                    self.text,
                    glob.text,
                );
            }
        }
    }
}

/// One glob of a pattern, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Glob {
    /// Whether it started with `!`.
    negated: bool,
    /// Without the `!`, trimmed.
    text: String,
    tokens: Vec<Token>,
}

impl Glob {
    fn matches(&self, name: &[char]) -> bool {
        fnmatch(&self.tokens, name)
    }

    /// A plain name: every token a literal character.
    fn is_plain(&self) -> bool {
        self.tokens
            .iter()
            .all(|token| matches!(token, Token::Char(_)))
    }
}

/// One element of a glob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// This character.
    Char(char),
    /// `?`: any one character.
    AnyOne,
    /// `*`: any run of characters, possibly empty.
    AnyMany,
    /// `[...]`: one character in (or, with `[!...]`, not in) these inclusive ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    /// Whether this single-character token accepts `c` (never called for `AnyMany`).
    fn accepts(&self, c: char) -> bool {
        match self {
            Token::Char(expected) => *expected == c,
            Token::AnyOne => true,
            Token::AnyMany => false,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|(low, high)| (*low..=*high).contains(&c)) != *negated
            }
        }
    }
}

/// Compiles a glob as Python's `fnmatch.translate` reads it; `None` for a `[` that no `]` closes.
///
/// In a class, a `!` first negates it, a `]` first (after the `!`) is literal, `a-z` is a range, and a
/// `-` first or last is literal; `\` escapes nothing (as in `fnmatch`).
fn compile(glob: &str) -> Option<Vec<Token>> {
    let chars: Vec<char> = glob.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                if tokens.last() != Some(&Token::AnyMany) {
                    tokens.push(Token::AnyMany);
                }
                i += 1;
            }
            '?' => {
                tokens.push(Token::AnyOne);
                i += 1;
            }
            '[' => {
                let mut j = i + 1;
                let negated = chars.get(j) == Some(&'!');
                if negated {
                    j += 1;
                }
                let start = j;
                if chars.get(j) == Some(&']') {
                    j += 1;
                }
                while j < chars.len() && chars[j] != ']' {
                    j += 1;
                }
                if j >= chars.len() {
                    return None;
                }
                let members = &chars[start..j];
                let mut ranges = Vec::new();
                let mut k = 0;
                while k < members.len() {
                    if k + 2 < members.len() && members[k + 1] == '-' {
                        ranges.push((members[k], members[k + 2]));
                        k += 3;
                    } else {
                        ranges.push((members[k], members[k]));
                        k += 1;
                    }
                }
                tokens.push(Token::Class { negated, ranges });
                i = j + 1;
            }
            c => {
                tokens.push(Token::Char(c));
                i += 1;
            }
        }
    }
    Some(tokens)
}

/// Whether `name` matches the whole glob: the classic wildcard walk, backtracking only to the last
/// `*` (every other token takes exactly one character), so it is linear in practice.
fn fnmatch(tokens: &[Token], name: &[char]) -> bool {
    let (mut t, mut n) = (0, 0);
    // After the last `*` seen: where its tokens resume, and where in the name it stopped eating.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match tokens.get(t) {
            Some(Token::AnyMany) => {
                star = Some((t + 1, n));
                t += 1;
            }
            Some(token) if token.accepts(name[n]) => {
                t += 1;
                n += 1;
            }
            _ => match star {
                Some((resume, eaten)) => {
                    star = Some((resume, eaten + 1));
                    t = resume;
                    n = eaten + 1;
                }
                None => return false,
            },
        }
    }
    tokens[t..].iter().all(|token| *token == Token::AnyMany)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(texts: &[&str]) -> NamespacePatterns {
        let texts: Vec<String> = texts.iter().map(ToString::to_string).collect();
        NamespacePatterns::parse(&texts).unwrap()
    }

    fn served(texts: &[&str], names: &[&str]) -> Vec<String> {
        let patterns = patterns(texts);
        names
            .iter()
            .filter(|name| patterns.matches(name))
            .map(ToString::to_string)
            .collect()
    }

    fn glob(glob: &str, name: &str) -> bool {
        let tokens = compile(glob).unwrap();
        fnmatch(&tokens, &name.chars().collect::<Vec<_>>())
    }

    const NAMES: &[&str] = &[
        "default",
        "kube-system",
        "kube-public",
        "ns1",
        "ns2",
        "xs1",
        "a-1",
        "b-2",
        "c-3",
    ];

    #[test]
    fn fnmatch_matches_whole_names_with_stars_and_question_marks() {
        for (pattern, name, expected) in [
            ("ns1", "ns1", true),
            ("ns", "ns1", false),
            ("*", "ns1", true),
            ("*", "", true),
            ("ns*", "ns1", true),
            ("ns?", "ns1", true),
            ("ns??", "ns1", false),
            ("n*1", "ns1", true),
            ("n?1", "ns1", true),
            ("n??1", "ns1", false),
            ("*1", "ns1", true),
            ("?1", "ns1", false),
            ("??1", "ns1", true),
            ("ns*x", "ns1", false),
            ("*-pr-*", "app-pr-12", true),
            ("*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false),
        ] {
            assert_eq!(glob(pattern, name), expected, "{pattern:?} on {name:?}");
        }
    }

    #[test]
    fn fnmatch_classes_take_one_character_from_a_set_or_range() {
        for (pattern, name, expected) in [
            ("[ab]-*", "a-1", true),
            ("[ab]-*", "c-1", false),
            ("[!ab]-*", "c-1", true),
            ("[!ab]-*", "a-1", false),
            ("ns[0-9]", "ns7", true),
            ("ns[0-9]", "nsx", false),
            ("[]a]x", "]x", true),
            ("[a-]x", "-x", true),
            ("[-a]x", "-x", true),
            ("[z-a]x", "ax", false),
        ] {
            assert_eq!(glob(pattern, name), expected, "{pattern:?} on {name:?}");
        }
        assert_eq!(compile("[ab"), None);
        assert_eq!(compile("x[]"), None);
    }

    #[test]
    fn kopfs_documented_patterns_serve_what_kopf_serves() {
        assert_eq!(served(&["*"], NAMES), NAMES);
        assert_eq!(served(&["kube-*"], NAMES), ["kube-system", "kube-public"]);
        assert_eq!(
            served(&["!kube-*"], NAMES),
            ["default", "ns1", "ns2", "xs1", "a-1", "b-2", "c-3"]
        );
        assert_eq!(served(&["*,!kube-*"], NAMES), served(&["!kube-*"], NAMES));
        assert_eq!(
            served(&["!kube-*,kube-public"], NAMES),
            [
                "default",
                "kube-public",
                "ns1",
                "ns2",
                "xs1",
                "a-1",
                "b-2",
                "c-3"
            ]
        );
        assert_eq!(served(&["?s1"], NAMES), ["ns1", "xs1"]);
        assert_eq!(served(&["[ab]-*"], NAMES), ["a-1", "b-2"]);
    }

    #[test]
    fn later_inclusions_only_re_include_what_the_first_glob_matched() {
        // Kopf's own examples (the docstring of `match_namespace`, and its tests).
        let names = [
            "myapp-test",
            "myapp-pr-123",
            "myapp-pr-456",
            "otherapp-pr-123",
        ];
        assert_eq!(
            served(&["myapp-*, !*-pr-*, *pr-123"], &names),
            ["myapp-test", "myapp-pr-123"]
        );
        assert_eq!(
            served(&["!*-pr-*, *pr-123"], &names),
            ["myapp-test", "myapp-pr-123", "otherapp-pr-123"]
        );
        assert_eq!(served(&["ns1,ns2"], NAMES), ["ns1"]);
        assert_eq!(served(&["ns2,ns1"], NAMES), ["ns2"]);
        assert_eq!(served(&["ns*,!ns1,ns1"], NAMES), ["ns1", "ns2"]);
        assert_eq!(served(&["ns*,!ns*,ns1"], NAMES), ["ns1"]);
        assert_eq!(served(&["!ns*,ns?"], &["ns1", "ns12", "x"]), ["ns1", "x"]);
    }

    #[test]
    fn exclusions_after_an_inclusion_remove_what_they_match() {
        assert_eq!(served(&["ns*,!ns1"], NAMES), ["ns2"]);
        assert_eq!(served(&["ns*,!ns3"], NAMES), ["ns1", "ns2"]);
        assert_eq!(served(&["!ns1"], &["ns1", "ns2"]), ["ns2"]);
    }

    #[test]
    fn whitespace_around_globs_is_ignored() {
        assert_eq!(served(&[" ns1 "], NAMES), ["ns1"]);
        assert_eq!(served(&[" ns1 , ns2 "], NAMES), ["ns1"]);
        assert_eq!(
            served(
                &[" ! kube-* , kube-public "],
                &["kube-public", "kube-system", "x"]
            ),
            ["kube-public", "x"]
        );
    }

    #[test]
    fn a_namespace_is_served_if_any_pattern_matches() {
        assert_eq!(served(&["ns1", "ns2"], NAMES), ["ns1", "ns2"]);
        assert_eq!(
            served(&["kube-*", "?s2"], NAMES),
            ["kube-system", "kube-public", "ns2"]
        );
        // An exclusion in one pattern does not stop another pattern from serving the name.
        assert_eq!(
            served(
                &["!kube-*", "kube-system"],
                &["kube-system", "kube-public", "x"]
            ),
            ["kube-system", "x"]
        );
    }

    #[test]
    fn plain_names_are_served_exactly_without_watching_namespaces() {
        assert_eq!(
            patterns(&["ns1"]).exact_names(),
            Some(vec!["ns1".to_string()])
        );
        assert_eq!(
            patterns(&["ns2", "ns1", "ns2"]).exact_names(),
            Some(vec!["ns2".to_string(), "ns1".to_string()])
        );
        assert_eq!(
            patterns(&[" ns1 , ns2 "]).exact_names(),
            Some(vec!["ns1".to_string()])
        );
        for globbed in ["ns*", "ns?", "[ab]-1", "!ns1", "ns1,!ns2"] {
            assert_eq!(
                patterns(&["default", globbed]).exact_names(),
                None,
                "{globbed}"
            );
        }
    }

    #[test]
    fn invalid_patterns_are_one_line_errors() {
        let parse = |texts: &[&str]| {
            let texts: Vec<String> = texts.iter().map(ToString::to_string).collect();
            NamespacePatterns::parse(&texts).unwrap_err()
        };
        assert_eq!(parse(&[]), PatternError::NoPatterns);
        assert_eq!(
            parse(&["ns1", "  "]),
            PatternError::Empty {
                pattern: "  ".into()
            }
        );
        for text in ["ns1,,ns2", "ns1,", "!", "ns1, ! "] {
            assert_eq!(
                parse(&[text]),
                PatternError::EmptyGlob {
                    pattern: text.into()
                },
                "{text}"
            );
        }
        let error = parse(&["default,[ab-*"]);
        assert_eq!(
            error,
            PatternError::UnclosedBracket {
                pattern: "default,[ab-*".into(),
                glob: "[ab-*".into()
            }
        );
        assert_eq!(
            error.to_string(),
            "the namespace pattern \"default,[ab-*\" has an invalid glob \"[ab-*\": its \"[\" is never closed \
             by \"]\"; write a character class such as \"[ab]-*\""
        );
        for error in [PatternError::NoPatterns, parse(&[""]), parse(&["a,,b"])] {
            assert!(!error.to_string().contains('\n'), "{error}");
        }
    }

    #[test]
    fn patterns_display_as_given() {
        assert_eq!(
            patterns(&["kube-*", "!a, b"]).to_string(),
            "\"kube-*\", \"!a, b\""
        );
    }
}

//! `wordcount`: counts the words, lines and characters of a text and lists
//! the most frequent words.
//!
//! Payload `{"text": "...", "top": 3}` (`top` optional, default 10) →
//! `{"words": N, "lines": N, "chars": N, "top": [["word", count], ...]}`.
//! A word is a run of letters and digits, lowercased; an apostrophe or hyphen
//! between two letters/digits stays inside it ("don't", "well-known"); all
//! other punctuation separates words. `chars` counts Unicode scalar values;
//! `lines` counts lines as `str::lines` does (a final newline starts no new
//! line). Ties in `top` are broken alphabetically.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sweep_guest::Error;

const DEFAULT_TOP: usize = 10;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    text: String,
    #[serde(default = "default_top")]
    top: usize,
}

fn default_top() -> usize {
    DEFAULT_TOP
}

#[derive(Debug, PartialEq, Serialize)]
struct Output {
    words: usize,
    lines: usize,
    chars: usize,
    top: Vec<(String, usize)>,
}

fn handle(input: Input) -> Result<Output, Error> {
    let output = count(&input.text, input.top);
    sweep_guest::log!("counted {} words in {} lines", output.words, output.lines);
    Ok(output)
}

fn count(text: &str, top: usize) -> Output {
    let mut frequencies: HashMap<String, usize> = HashMap::new();
    let mut words = 0;
    for word in words_of(text) {
        words += 1;
        *frequencies.entry(word).or_default() += 1;
    }
    let mut ranked: Vec<(String, usize)> = frequencies.into_iter().collect();
    ranked.sort_by(|(a, a_count), (b, b_count)| b_count.cmp(a_count).then_with(|| a.cmp(b)));
    ranked.truncate(top);
    Output { words, lines: text.lines().count(), chars: text.chars().count(), top: ranked }
}

/// Splits `text` into lowercased words (see the module docs).
fn words_of(text: &str) -> impl Iterator<Item = String> + '_ {
    let mut chars = text.chars().peekable();
    std::iter::from_fn(move || {
        let mut word = String::new();
        while let Some(c) = chars.next() {
            if c.is_alphanumeric() {
                word.extend(c.to_lowercase());
            } else if is_joiner(c)
                && !word.is_empty()
                && chars.peek().is_some_and(|next| next.is_alphanumeric())
            {
                word.push(if c == '\u{2019}' { '\'' } else { c });
            } else if !word.is_empty() {
                return Some(word);
            }
        }
        (!word.is_empty()).then_some(word)
    })
}

/// Punctuation kept inside a word: apostrophes (straight and typographic)
/// and hyphens.
fn is_joiner(c: char) -> bool {
    matches!(c, '\'' | '\u{2019}' | '-')
}

fn main() {
    sweep_guest::run(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        words_of(text).collect()
    }

    fn pair(word: &str, n: usize) -> (String, usize) {
        (word.to_string(), n)
    }

    #[test]
    fn counts_the_example() {
        let out = count("a b a", 3);
        assert_eq!(
            out,
            Output { words: 3, lines: 1, chars: 5, top: vec![pair("a", 2), pair("b", 1)] }
        );
    }

    #[test]
    fn case_insensitive_and_punctuation_stripped() {
        assert_eq!(words("Hello, hello! HELLO? (world)..."), ["hello", "hello", "hello", "world"]);
    }

    #[test]
    fn keeps_inner_apostrophes_and_hyphens() {
        assert_eq!(
            words("Don't stop: well-known -- 'quoted' rock\u{2019}n\u{2019}roll x-"),
            ["don't", "stop", "well-known", "quoted", "rock'n'roll", "x"]
        );
    }

    #[test]
    fn unicode_words_and_chars() {
        let out = count("Grüße, GRÜSSE und 東京", 10);
        assert_eq!(out.words, 4);
        assert_eq!(out.chars, 20);
        assert_eq!(words("ÉCOLE école"), ["école", "école"]);
    }

    #[test]
    fn lines() {
        assert_eq!(count("", 1).lines, 0);
        assert_eq!(count("one\n", 1).lines, 1);
        assert_eq!(count("one\ntwo\r\n\nfour", 1).lines, 4);
    }

    #[test]
    fn empty_and_punctuation_only_text() {
        let out = count("  --- ... !!! ", 5);
        assert_eq!(out.words, 0);
        assert!(out.top.is_empty());
    }

    #[test]
    fn top_is_ranked_by_count_then_alphabetically_and_truncated() {
        let out = count("c b a b c c d", 3);
        assert_eq!(out.top, vec![pair("c", 3), pair("b", 2), pair("a", 1)]);
        assert!(count("a b", 0).top.is_empty());
    }

    #[test]
    fn payload_shape() {
        let input: Input = serde_json::from_str(r#"{"text": "x"}"#).expect("valid");
        assert_eq!(input.top, DEFAULT_TOP);
        let json = serde_json::to_value(count("a b a", 1)).expect("serialize");
        assert_eq!(
            json,
            serde_json::json!({"words": 3, "lines": 1, "chars": 5, "top": [["a", 2]]})
        );
        assert!(serde_json::from_str::<Input>(r#"{"txt": "x"}"#).is_err());
    }
}

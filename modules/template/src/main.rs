//! `template`: fills `{{name}}` placeholders from a map of variables.
//!
//! Payload `{"template": "Hello {{name}}!", "vars": {"name": "Ada"}}` →
//! `{"rendered": "Hello Ada!"}`. Spaces inside the braces are ignored
//! (`{{ name }}`). Strings are inserted as they are, `null` as nothing, and
//! numbers, booleans, arrays and objects as compact JSON. There is no
//! escaping and no logic: single braces pass through untouched. Missing
//! variables (all of them are named), an empty `{{}}` or an unclosed `{{`
//! are permanent failures.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sweep_guest::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    template: String,
    #[serde(default)]
    vars: Map<String, Value>,
}

#[derive(Debug, PartialEq, Serialize)]
struct Output {
    rendered: String,
}

fn handle(input: Input) -> Result<Output, Error> {
    render(&input.template, &input.vars).map(|rendered| Output { rendered })
}

fn render(template: &str, vars: &Map<String, Value>) -> Result<String, Error> {
    let mut rendered = String::with_capacity(template.len());
    let mut missing: Vec<&str> = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        let at = template.len() - rest.len() + open;
        rendered.push_str(&rest[..open]);
        let inside = &rest[open + 2..];
        let close = inside
            .find("}}")
            .filter(|&close| !inside[..close].contains("{{"))
            .ok_or_else(|| Error::permanent(format!("unclosed \"{{{{\" at byte {at}")))?;
        let name = inside[..close].trim();
        if name.is_empty() {
            return Err(Error::permanent(format!("empty placeholder at byte {at}")));
        }
        match vars.get(name) {
            Some(Value::String(text)) => rendered.push_str(text),
            Some(Value::Null) => {}
            Some(other) => rendered.push_str(&other.to_string()),
            None if missing.contains(&name) => {}
            None => missing.push(name),
        }
        rest = &inside[close + 2..];
    }
    rendered.push_str(rest);
    match missing.as_slice() {
        [] => Ok(rendered),
        [name] => Err(Error::permanent(format!("missing variable {name:?}"))),
        names => {
            let quoted: Vec<String> = names.iter().map(|name| format!("{name:?}")).collect();
            Err(Error::permanent(format!("missing variables {}", quoted.join(", "))))
        }
    }
}

fn main() {
    sweep_guest::run(handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    fn render_json(template: &str, value: Value) -> Result<String, Error> {
        render(template, &vars(value))
    }

    #[test]
    fn renders_the_example() {
        let out = render_json("Hello {{name}}!", json!({"name": "Ada"}));
        assert_eq!(out.expect("renders"), "Hello Ada!");
    }

    #[test]
    fn repeats_spaces_and_neighbours() {
        let out = render_json("{{a}}{{ a }}-{{b}}", json!({"a": "x", "b": "y"}));
        assert_eq!(out.expect("renders"), "xx-y");
    }

    #[test]
    fn non_string_values() {
        let out = render_json(
            "{{n}} {{t}} [{{z}}] {{l}} {{o}}",
            json!({"n": 4.5, "t": true, "z": null, "l": [1, "a"], "o": {"k": 1}}),
        );
        assert_eq!(out.expect("renders"), r#"4.5 true [] [1,"a"] {"k":1}"#);
    }

    #[test]
    fn text_without_placeholders_is_unchanged() {
        let text = "no {tags} here, just { braces } and ünïcödé }}";
        assert_eq!(render_json(text, json!({})).expect("renders"), text);
        assert_eq!(render_json("", json!({})).expect("renders"), "");
    }

    #[test]
    fn values_are_not_re_expanded() {
        let out = render_json("{{a}}", json!({"a": "{{b}}", "b": "no"}));
        assert_eq!(out.expect("renders"), "{{b}}");
    }

    #[test]
    fn missing_variable_is_permanent_and_named() {
        let err = render_json("Hi {{name}}", json!({})).expect_err("missing");
        assert!(err.is_permanent());
        assert_eq!(err.message(), r#"missing variable "name""#);
    }

    #[test]
    fn all_missing_variables_are_named_once() {
        let err = render_json("{{a}} {{b}} {{a}} {{c}}", json!({"b": 1})).expect_err("missing");
        assert_eq!(err.message(), r#"missing variables "a", "c""#);
    }

    #[test]
    fn malformed_placeholders_are_permanent() {
        let err = render_json("ok {{name", json!({"name": 1})).expect_err("unclosed");
        assert!(err.is_permanent());
        assert_eq!(err.message(), r#"unclosed "{{" at byte 3"#);

        let err = render_json("{{a {{b}}", json!({"b": 1})).expect_err("nested");
        assert_eq!(err.message(), r#"unclosed "{{" at byte 0"#);

        let err = render_json("x{{ }}", json!({})).expect_err("empty");
        assert_eq!(err.message(), "empty placeholder at byte 1");
    }

    #[test]
    fn vars_are_optional() {
        let input: Input = serde_json::from_str(r#"{"template": "plain"}"#).expect("valid");
        assert_eq!(handle(input).expect("renders").rendered, "plain");
    }
}

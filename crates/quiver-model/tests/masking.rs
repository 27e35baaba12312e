//! Property tests of secret masking and redaction (issue #10.12): whatever
//! surrounds them, a record's literal secrets never survive `redact`, a
//! masked URL written back restores exactly the stored URL, and no name with
//! an invisible character passes as a tool name.

use proptest::prelude::*;
use quiver_model::naming::{ToolNameError, is_invisible, validate_tool_name};
use quiver_model::{HttpConfig, MASK, McpServerSpec, StdioConfig, Transport, redact_url};
use quiver_testkit::fuzz::cases;

/// Secret-looking values: 4 to 24 URL-safe characters.
fn secret() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_.~-]{4,24}"
}

/// Text around a secret: anything printable, URLs and separators included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,40}",
        Just("error sending request for url (".to_owned()),
        Just("; stderr: ".to_owned()),
    ]
}

fn stdio_with(env: &[(&str, &str)]) -> McpServerSpec {
    let mut spec = McpServerSpec::new("s", Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: "x".into(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    });
    spec
}

fn http_with(url: &str) -> McpServerSpec {
    let mut spec = McpServerSpec::new("h", Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: url.into(),
        ..Default::default()
    });
    spec
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn env_secrets_never_survive_redaction(
        secret in secret(),
        before in text(),
        after in text(),
        repeats in 1usize..4,
    ) {
        let spec = stdio_with(&[("API_KEY", &secret)]);
        let quoted = format!("{before}{}{after}", secret.repeat(repeats));
        prop_assert!(!spec.redact(&quoted).contains(&secret));
    }

    #[test]
    fn url_secrets_never_survive_redaction_and_round_trip(
        user in secret(),
        password in secret(),
        key in secret(),
        harmless in "[a-z0-9]{1,3}",
        before in text(),
    ) {
        let url = format!("https://{user}:{password}@mcp.example/p?region={harmless}&api_key={key}");
        let spec = http_with(&url);
        let redacted = spec.redact(&format!("{before} {url} and again {url})"));
        for secret in [&user, &password, &key] {
            prop_assert!(!redacted.contains(secret.as_str()), "{} in {}", secret, redacted);
        }
        let kept = format!("region={harmless}");
        prop_assert!(redacted.contains(&kept), "{} not in {}", kept, redacted);
        // Any text holding the URL: its URL secrets are masked without the record.
        let scrubbed = redact_url(&url);
        prop_assert_eq!(
            &scrubbed,
            &format!("https://{MASK}:{MASK}@mcp.example/p?region={harmless}&api_key={MASK}")
        );
        // Masked and sent back: the stored URL exactly.
        let mut sent = spec.masked();
        prop_assert!(sent.has_masked_values());
        sent.restore_masked(Some(&spec)).unwrap();
        prop_assert_eq!(sent, spec);
    }

    #[test]
    fn no_invisible_character_passes_as_a_tool_name(
        head in "[a-z]{0,10}",
        tail in "[a-z]{0,10}",
        invisible in prop::sample::select(
            ('\0'..=char::MAX).filter(|c| is_invisible(*c)).collect::<Vec<_>>()
        ),
    ) {
        let name = format!("{head}{invisible}{tail}");
        prop_assert_eq!(
            validate_tool_name(&name),
            Err(ToolNameError::InvisibleCharacter {
                index: head.len(),
                code_point: u32::from(invisible),
            })
        );
    }
}

//! Which upstream answers are worth another attempt, and when.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

/// What to do with an answer's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: use it.
    Success,
    /// 429 or 5xx: try again (within the budget).
    Retry,
    /// Any other status: the request itself is wrong; retrying cannot help.
    Reject,
}

/// Classifies a status (R-CHAT-6).
pub fn verdict(status: StatusCode) -> Verdict {
    if status.is_success() {
        Verdict::Success
    } else if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        Verdict::Retry
    } else {
        Verdict::Reject
    }
}

/// The pause the upstream asks for: `retry-after-ms` (sent by OpenAI), else
/// `Retry-After` in seconds or as an HTTP date.
pub fn requested_pause(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = header("retry-after")?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(verdict(StatusCode::OK), Verdict::Success);
        assert_eq!(verdict(StatusCode::TOO_MANY_REQUESTS), Verdict::Retry);
        assert_eq!(verdict(StatusCode::SERVICE_UNAVAILABLE), Verdict::Retry);
        assert_eq!(verdict(StatusCode::INTERNAL_SERVER_ERROR), Verdict::Retry);
        for status in [400, 401, 403, 404, 409, 413, 422] {
            assert_eq!(
                verdict(StatusCode::from_u16(status).unwrap()),
                Verdict::Reject,
                "{status}"
            );
        }
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_str(value).unwrap());
            }
            map
        };
        assert_eq!(requested_pause(&headers(&[]), now), None);
        assert_eq!(
            requested_pause(&headers(&[("retry-after", "2")]), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            requested_pause(&headers(&[("retry-after", "0.5")]), now),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            requested_pause(
                &headers(&[("retry-after", "3"), ("retry-after-ms", "150")]),
                now
            ),
            Some(Duration::from_millis(150))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(
            requested_pause(&headers(&[("retry-after", &date)]), now),
            Some(Duration::from_secs(7))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(7));
        assert_eq!(
            requested_pause(&headers(&[("retry-after", &past)]), now),
            Some(Duration::ZERO)
        );
        for junk in ["soon", "-1", "NaN", "inf"] {
            assert_eq!(
                requested_pause(&headers(&[("retry-after", junk)]), now),
                None,
                "{junk}"
            );
        }
    }
}

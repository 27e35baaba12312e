//! One way of getting a chat answer in the chat benchmarks: a request posted
//! to `url` whose answer must be `answer`. Included by each benchmark with
//! `#[path = "support/route.rs"] mod route;`.

use serde_json::Value;

use crate::stack::BenchResult;

/// A chat request posted to `url`, answered with `answer`.
pub struct Route {
    /// The HTTP client.
    pub client: reqwest::Client,
    /// Where the body goes.
    pub url: String,
    /// The caller token, if the route needs one.
    pub bearer: Option<&'static str>,
    /// The request body.
    pub body: Vec<u8>,
    /// The text the answer must carry.
    pub answer: &'static str,
}

impl Route {
    /// Posts the body once; an answer other than `answer` is an error.
    pub async fn call(&self) -> BenchResult<()> {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .body(self.body.clone());
        if let Some(token) = self.bearer {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        let status = response.status();
        let answer: Value = response.json().await?;
        if !status.is_success() || answer["choices"][0]["message"]["content"] != self.answer {
            return Err(format!("unexpected answer {status}: {answer}").into());
        }
        Ok(())
    }
}

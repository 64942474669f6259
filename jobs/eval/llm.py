"""A minimal OpenAI-compatible chat client (urllib only) and the generate-and-judge faithfulness score.

Used only with `qasc eval --llm-url URL`: URL is the API base (e.g. http://127.0.0.1:8000/v1); requests go to
URL/chat/completions. An API key, when the server needs one, is read from the environment variable named
by `key_env` (default QASC_LLM_API_KEY) and sent as a bearer token.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request

from qasc.engine.errors import QascError


class ChatClient:
    def __init__(self, url: str, model: str = "default", timeout: float = 120.0, retries: int = 2,
                 key_env: str = "QASC_LLM_API_KEY", max_tokens: int = 256) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.key = os.environ.get(key_env) or None
        self.max_tokens = max_tokens
        self.calls = 0

    def chat(self, prompt: str, system: str | None = None) -> str:
        """One user message (and an optional system message) -> the assistant's reply text."""
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        body = json.dumps({"model": self.model, "messages": messages, "temperature": 0,
                           "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        endpoint = f"{self.url}/chat/completions"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    data = json.loads(resp.read().decode("utf-8"))
                self.calls += 1
                return str(data["choices"][0]["message"]["content"] or "")
            except (urllib.error.URLError, TimeoutError, json.JSONDecodeError, KeyError, IndexError) as exc:
                last = exc
                if isinstance(exc, urllib.error.HTTPError) and 400 <= exc.code < 500 and exc.code != 429:
                    break
                time.sleep(min(8.0, 0.5 * 2**attempt))
        raise QascError(f"LLM endpoint {endpoint} failed: {last}")


ANSWER_PROMPT = (
    "Answer the question using only the context below. If the context does not contain the answer, say "
    "\"not in context\".\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:"
)
JUDGE_PROMPT = (
    "You grade answers. Reference evidence (ground truth):\n{evidence}\n\nQuestion: {question}\n"
    "Answer to grade: {answer}\n\nHow much of the reference evidence needed to answer the question does the "
    "answer state correctly, without contradicting it? Reply with one number between 0 and 1 and nothing else."
)


def parse_score(reply: str) -> float:
    """The first number in a reply, clipped to [0, 1] (0 when there is none)."""
    m = re.search(r"\d*\.?\d+", reply)
    return min(1.0, max(0.0, float(m.group()))) if m else 0.0


def generate_and_judge(client: ChatClient, question: str, context: list[str], evidence: list[str]) -> dict:
    """Generate an answer from the retrieved context, then judge it against the reference evidence.

    -> {answer, score}: score in [0, 1], how much of the evidence the answer correctly conveys.
    """
    ctx = "\n---\n".join(context) if context else "(nothing retrieved)"
    answer = client.chat(ANSWER_PROMPT.format(context=ctx, question=question))
    reply = client.chat(JUDGE_PROMPT.format(evidence="\n".join(evidence), question=question, answer=answer))
    return {"answer": answer, "score": parse_score(reply)}

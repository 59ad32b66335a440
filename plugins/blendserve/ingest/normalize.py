"""Check one raw record and turn it into a request, or say why not.

Accepts our JSONL/CSV/Parquet fields (``custom_id`` plus one of ``prompt``,
``messages``, ``prompt_token_ids``, and optional sampling fields) and the
OpenAI batch format (``custom_id``, ``method``, ``url``, ``body``). Every
reason names the field and what to do about it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
ROLES = {"system", "user", "assistant", "developer"}
MAX_STOP_STRINGS = 16


class Reject(Exception):
    """A record that cannot become a request; the message is the reason shown to the user."""


@dataclass
class Limits:
    default_max_tokens: int  # for records that give none
    max_model_len: int  # context length of the model
    vocab_size: int  # for prompt_token_ids range checks


@dataclass
class Normalized:
    request_id: str
    endpoint: str  # "chat" | "completion" | "tokens"
    prompt: str | None
    messages: list[dict] | None
    prompt_token_ids: list[int] | None  # given by the user; else tokenized later
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str] | None
    expected_output_tokens: int | None
    sim_output_tokens: int | None
    metadata_json: str | None  # the record's metadata, as stored


def normalize(data: dict, limits: Limits) -> Normalized:
    """The request in ``data``, or Reject with the reason. A check that breaks on a value nobody
    foresaw rejects that record too (logged with its traceback): one odd row never stops a job."""
    try:
        return _normalize(data, limits)
    except Reject:
        raise
    except (TypeError, ValueError, ArithmeticError, RecursionError) as err:
        log.warning("record could not be checked", exc_info=True)
        raise Reject(f"record could not be checked ({type(err).__name__}: {str(err)[:200]})") from None


def _normalize(data: dict, limits: Limits) -> Normalized:
    custom_id = data.get("custom_id")
    if custom_id is None or (isinstance(custom_id, str) and not custom_id.strip()):
        raise Reject("missing custom_id: every request needs an id to match its result")
    if not isinstance(custom_id, (str, int)) or isinstance(custom_id, bool):
        raise Reject(f"custom_id must be a string, got {type(custom_id).__name__}")
    _check_text(str(custom_id), "custom_id")
    body, endpoint = _body_and_endpoint(data)
    prompt, messages, token_ids, endpoint = _prompt_fields(body, endpoint, limits)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", limits.default_max_tokens))
    return Normalized(
        request_id=str(custom_id),
        endpoint=endpoint,
        prompt=prompt,
        messages=messages,
        prompt_token_ids=token_ids,
        max_tokens=_int_in(max_tokens, "max_tokens", 1, limits.max_model_len),
        temperature=_float_in(body.get("temperature", 0.0), "temperature", 0.0, 2.0),
        top_p=_top_p(body.get("top_p", 1.0)),
        seed=None if body.get("seed") is None else _int_in(body["seed"], "seed", 0, 2**63 - 1),
        stop=_stop(body.get("stop")),
        expected_output_tokens=_optional_count(data, body, "expected_output_tokens"),
        sim_output_tokens=_optional_count(data, body, "sim_output_tokens"),
        metadata_json=_metadata_json(data.get("metadata", body.get("metadata"))),
    )


def _check_text(text: str, name: str) -> str:
    """``text``, if it can be stored and tokenized: JSON's ``\\ud800`` escapes give lone surrogates,
    which are not Unicode text and which UTF-8 (Parquet, the tokenizer) cannot encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Reject(f"{name} has a lone surrogate ({text[err.start]!r}) at character {err.start}; "
                     "it is not valid Unicode text") from None
    return text


def _metadata_json(metadata: Any) -> str | None:
    if metadata is None:
        return None
    try:  # default=str: Parquet inputs bring dates and decimals
        return _check_text(json.dumps(metadata, ensure_ascii=False, default=str), "metadata")
    except (RecursionError, ValueError) as err:
        raise Reject(f"metadata cannot be stored as JSON: {type(err).__name__}") from None


def _shown(value: Any) -> str:
    """A short form of any value for a reason (dates, decimals, huge numbers included)."""
    try:
        return json.dumps(value, default=str)[:40]
    except (RecursionError, ValueError):
        return type(value).__name__


def _body_and_endpoint(data: dict) -> tuple[dict, str | None]:
    if "body" not in data and "url" not in data:
        return data, None
    url = data.get("url")
    if not isinstance(url, str) or url not in ENDPOINTS:
        raise Reject(f"unsupported endpoint {_shown(url)}: use /v1/chat/completions or /v1/completions")
    method = data.get("method", "POST")
    if method != "POST":
        raise Reject(f"unsupported method {method!r}: batch requests are POST")
    body = data.get("body")
    if not isinstance(body, dict):
        raise Reject("body must be a JSON object with the request's parameters")
    if body.get("n", 1) != 1:
        raise Reject("n must be 1: send one request per wanted completion")
    return body, ENDPOINTS[url]


def _prompt_fields(body: dict, endpoint: str | None, limits: Limits):
    given = [k for k in ("prompt", "messages", "prompt_token_ids") if body.get(k) is not None]
    if endpoint == "chat" and given != ["messages"]:
        raise Reject("a /v1/chat/completions body needs messages (and no prompt)")
    if endpoint == "completion" and given != ["prompt"]:
        raise Reject("a /v1/completions body needs prompt (and no messages)")
    if len(given) != 1:
        found = ", ".join(given) or "none"
        raise Reject(f"give exactly one of prompt, messages, prompt_token_ids (found: {found})")
    if given == ["prompt"]:
        return _prompt_text(body["prompt"]), None, None, "completion"
    if given == ["messages"]:
        return None, _messages(body["messages"]), None, "chat"
    return None, None, _token_ids(body["prompt_token_ids"], limits.vocab_size), "tokens"


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # OpenAI allows a one-element list
    if not isinstance(prompt, str):
        raise Reject(f"prompt must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise Reject("prompt is empty")
    return _check_text(prompt, "prompt")


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise Reject("messages must be a non-empty list of {role, content} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Reject(f"messages[{i}] must be an object with role and content")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise Reject(f"messages[{i}].role is {_shown(role)}; use one of {sorted(ROLES)}")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: only text is supported
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise Reject(f"messages[{i}].content has non-text parts; only text is supported")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str) or not content.strip():
            raise Reject(f"messages[{i}].content must be a non-empty string")
    if not any(m["role"] == "user" for m in messages):
        raise Reject("messages has no user message")
    return [{"role": m["role"], "content": _check_text(_text(m["content"]), f"messages[{i}].content")}
            for i, m in enumerate(messages)]


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(str(p.get("text", "")) for p in content)


def _token_ids(ids: Any, vocab_size: int) -> list[int]:
    if not isinstance(ids, list) or not ids:
        raise Reject("prompt_token_ids must be a non-empty list of integers")
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
            raise Reject(f"prompt_token_ids[{i}] = {t!r} is not a token id in [0, {vocab_size})")
    return ids


def _int_in(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise Reject(f"{name} must be an integer, got {_shown(value)}")
    if not low <= value <= high:
        raise Reject(f"{name} = {_shown(value)} is out of range [{low}, {high}]")
    return value


def _float_in(value: Any, name: str, low: float, high: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise Reject(f"{name} must be a number, got {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        number = float("inf")
    if not low <= number <= high:
        raise Reject(f"{name} = {_shown(value)} is out of range [{low}, {high}]")
    return number


def _top_p(value: Any) -> float:
    top_p = _float_in(value, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise Reject("top_p = 0 keeps no tokens; use a value in (0, 1]")
    return top_p


def _stop(stop: Any) -> list[str] | None:
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise Reject("stop must be a non-empty string or a list of non-empty strings")
    for i, s in enumerate(stops):
        _check_text(s, f"stop[{i}]")
    if len(stops) > MAX_STOP_STRINGS:
        raise Reject(f"stop has {len(stops)} strings; at most {MAX_STOP_STRINGS}")
    return stops


def _optional_count(data: dict, body: dict, name: str) -> int | None:
    value = data.get(name, body.get(name))
    return None if value is None else _int_in(value, name, 0, 10**9)

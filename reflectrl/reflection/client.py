"""Client of the frozen reflection model, over the OpenAI `/v1/completions` HTTP API.

Any OpenAI-compatible server works (vLLM here). All prompts of a rollout worker go in one
batched request (`prompt` is a list), because a CPU vLLM server is ~6x faster batched
than one stream at a time; `mode="concurrent"` sends one request per prompt in parallel for
servers that reject list prompts.

Greedy reflections (temperature 0) of a frozen model are a function of the prompt, so the
client remembers the last `cache_size` of them and sends each distinct prompt once: a Taxi
reflection prompt is one of 500 states under one of 2 instructions, so after a few thousand
steps almost none reach the server.

With `quotable` commands per prompt (reflection.quote_valid_actions), each request carries a
regular expression that lets a quoted span be only one of them (vLLM's structured outputs);
those go one prompt per request, in parallel, since a regex belongs to one prompt.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from time import sleep
from types import TracebackType
from typing import Any, Literal

import httpx

from reflectrl.errors import ReflectionServerError

Mode = Literal["batch", "concurrent"]
REGEX_SPECIAL = frozenset("\\.^$|?*+()[]{}-/")


def quoted_commands_regex(commands: Sequence[str]) -> str:
    """A regular expression for text whose every span between double quotes is one of
    `commands` (those without a quote of their own); outside quotes, any text."""
    names = sorted({c for c in commands if c and '"' not in c})
    if not names:
        return '[^"]*'
    escaped = ["".join(f"\\{ch}" if ch in REGEX_SPECIAL else ch for ch in name) for name in names]
    return f'[^"]*("({"|".join(escaped)})"[^"]*)*'


class ReflectionClient:
    """Gets one reflection per prompt from `base_url` (e.g. `http://127.0.0.1:8000/v1`).

    Connection errors, timeouts, HTTP 429 and 5xx are retried `max_retries` times with
    exponential backoff (`backoff_s`, 2x, 4x, ...); other 4xx fail at once, since
    repeating a rejected request cannot help. Counters: `calls` (reflections produced),
    `requests` (HTTP requests sent, retries included), `retries`, `completion_tokens`.
    The client can be pickled (e.g. into a Ray actor); the connection pool is recreated.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        max_tokens: int = 64,
        temperature: float = 0.0,
        stop: Sequence[str] = (" # Action", "\n\n"),
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        seed: int | None = 0,
        mode: Mode = "batch",
        max_concurrency: int = 16,
        api_key: str | None = None,
        locate: Callable[[int], str] | None = None,
        cache_size: int = 0,
    ) -> None:
        if mode not in ("batch", "concurrent"):
            raise ValueError(f"mode must be 'batch' or 'concurrent', not {mode!r}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        # One URL per server replica; this client talks to `urls[replica]` (use_replica).
        self.urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not self.urls:
            raise ValueError("base_url: give at least one URL")
        self.urls = [url.rstrip("/") for url in self.urls]
        self.replica = 0
        self.base_url = self.urls[0]
        self.api_key = api_key  # sent as `Authorization: Bearer ...`
        # locate(i): the current URL of replica i after it was restarted elsewhere (waits for
        # it); None: the address is fixed (an external server).
        self.locate = locate
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stop = tuple(stop)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.seed = seed
        self.mode: Mode = mode
        self.max_concurrency = max_concurrency
        self.calls = 0
        self.requests = 0
        self.retries = 0
        self.relocations = 0  # times a restarted replica was found at a new address
        self.completion_tokens = 0
        self.cache_hits = 0  # reflections answered from the cache (or a twin in the batch)
        # Only greedy answers are a function of the prompt; sampled ones must be drawn anew.
        self.cache_size = cache_size if temperature == 0 else 0
        # (prompt, regex of its quotable commands or None) -> reflection
        self._cache: OrderedDict[tuple[str, str | None], str] = OrderedDict()
        self._lock = threading.Lock()  # counters are updated from threads in concurrent mode
        self._http: httpx.Client | None = None

    # --- public API -----------------------------------------------------------------------

    def reflect(
        self, prompts: Sequence[str], quotable: Sequence[Sequence[str]] | None = None
    ) -> list[str]:
        """One reflection (whitespace-stripped) per prompt, in the order of `prompts`. With
        `quotable` (commands per prompt), each reflection quotes ("...") only its prompt's
        commands: the server decodes under `quoted_commands_regex`, one request per prompt."""
        prompts = list(prompts)
        if not prompts:
            return []
        rules: list[str | None] = [None] * len(prompts)
        if quotable is not None:
            rules = [quoted_commands_regex(commands) for commands in quotable]
        requests = list(zip(prompts, rules, strict=True))
        if not self.cache_size:
            texts = self._fetch(requests)
        else:
            known = {r: self._cache[r] for r in dict.fromkeys(requests) if r in self._cache}
            missing = [r for r in dict.fromkeys(requests) if r not in known]
            known.update(zip(missing, self._fetch(missing), strict=True))
            for request in known:
                self._cache[request] = known[request]
                self._cache.move_to_end(request)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            texts = [known[r] for r in requests]
            with self._lock:
                self.cache_hits += len(requests) - len(missing)
        with self._lock:
            self.calls += len(texts)
        return texts

    def _fetch(self, requests: list[tuple[str, str | None]]) -> list[str]:
        """The server's reflections of (prompt, regex) requests, in their order."""
        if not requests:
            return []
        constrained = any(rule is not None for _, rule in requests)
        if not constrained and (self.mode == "batch" or len(requests) == 1):
            return self._complete([prompt for prompt, _ in requests])
        workers = min(len(requests), self.max_concurrency)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return [t for (t,) in pool.map(lambda r: self._complete([r[0]], r[1]), requests)]

    def use_replica(self, index: int) -> None:
        """Talk to replica `index` mod the number of replicas (spreads workers evenly)."""
        self.replica = index % len(self.urls)
        self.base_url = self.urls[self.replica]

    def health(self) -> bool:
        """True when the server answers `GET /models` and serves `self.model`."""
        try:
            response = self._client().get(
                f"{self.base_url}/models", timeout=min(self.timeout_s, 5.0)
            )
            if response.status_code != 200:
                return False
            served = {entry.get("id") for entry in response.json().get("data", [])}
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        return self.model in served

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # --- internals ------------------------------------------------------------------------

    def _payload(self, prompts: list[str], regex: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "prompt": prompts,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "n": 1,
        }
        if self.stop:
            payload["stop"] = list(self.stop)
        if self.seed is not None:
            payload["seed"] = self.seed
        if regex is not None:
            payload["structured_outputs"] = {"regex": regex}  # vLLM's extension of the API
        return payload

    def _complete(self, prompts: list[str], regex: str | None = None) -> list[str]:
        body = self._post("/completions", self._payload(prompts, regex))
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list):
            raise ReflectionServerError(
                f"reflection server at {self.base_url} sent a response without choices"
            )
        # Choices may come back in any order: `index` says which prompt each answers.
        texts: list[str | None] = [None] * len(prompts)
        for position, choice in enumerate(choices):
            index = choice.get("index", position)
            valid = isinstance(index, int) and 0 <= index < len(prompts)
            if not valid or texts[index] is not None:
                raise ReflectionServerError(
                    f"reflection server at {self.base_url} sent a choice with bad index {index!r} "
                    f"for {len(prompts)} prompts"
                )
            texts[index] = str(choice.get("text") or "").strip()
        if any(text is None for text in texts):
            raise ReflectionServerError(
                f"reflection server at {self.base_url} answered {len(choices)} of "
                f"{len(prompts)} prompts"
            )
        usage = body.get("usage") or {}
        with self._lock:
            self.completion_tokens += int(usage.get("completion_tokens") or 0)
        return [text or "" for text in texts]

    def _post(self, path: str, payload: dict[str, Any]) -> Any:
        tries = self.max_retries + 1
        reason = ""
        for attempt in range(tries):
            if attempt:
                with self._lock:
                    self.retries += 1
                sleep(self.backoff_s * 2 ** (attempt - 1))
            with self._lock:
                self.requests += 1
            try:
                response = self._client().post(f"{self.base_url}{path}", json=payload)
            except httpx.TransportError as exc:  # connect errors, timeouts, broken connections
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                self._relocate()
                continue
            if response.status_code == 429 or response.status_code >= 500:
                reason = f"HTTP {response.status_code}: {_error_message(response)}"
                continue
            if response.status_code >= 400:
                raise ReflectionServerError(
                    _one_line(
                        f"reflection server at {self.base_url} rejected the request with "
                        f"HTTP {response.status_code}: {_error_message(response)}; check "
                        "reflection.model and the generation settings"
                    )
                )
            try:
                return response.json()
            except ValueError as exc:
                raise ReflectionServerError(
                    f"reflection server at {self.base_url} sent a response that is not JSON"
                ) from exc
        raise ReflectionServerError(
            _one_line(
                f"reflection server at {self.base_url} unreachable after {tries} tries: "
                f"{reason}; start it or fix reflection.url"
            )
        )

    def _relocate(self) -> None:
        """After a connection failure: ask where the replica is now (it may have been
        restarted on another port or node); the retry goes there."""
        if self.locate is None:
            return
        url = self.locate(self.replica).rstrip("/")
        if url != self.urls[self.replica]:
            with self._lock:
                self.urls[self.replica] = self.base_url = url
                self.relocations += 1

    def _client(self) -> httpx.Client:
        if self._http is None:
            with self._lock:
                if self._http is None:
                    limits = httpx.Limits(max_connections=max(self.max_concurrency, 1) + 4)
                    headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
                    self._http = httpx.Client(
                        timeout=httpx.Timeout(self.timeout_s), limits=limits, headers=headers
                    )
        return self._http

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_http"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __enter__(self) -> ReflectionClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _error_message(response: httpx.Response) -> str:
    """The server's own error text (OpenAI `{"error": {"message": ...}}` when present)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("message") or error.get("detail") or error)[:200]
        return str(error)[:200]
    return str(body)[:200]


def _one_line(text: str, limit: int = 600) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."

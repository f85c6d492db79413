"""ReflectionClient against a scripted local HTTP server that records every request."""

from __future__ import annotations

import pickle
import socket
from typing import Any

import pytest

from reflectrl.errors import ReflectionServerError
from reflectrl.reflection import client as client_module
from reflectrl.reflection.client import ReflectionClient
from tests.fake_openai_server import MODEL, FakeServer


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff sleeps, recorded instead of slept."""
    recorded: list[float] = []
    monkeypatch.setattr(client_module, "sleep", recorded.append)
    return recorded


def make_client(url: str, **kwargs: Any) -> ReflectionClient:
    return ReflectionClient(url, MODEL, **{"backoff_s": 0.01, **kwargs})


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_all_prompts_go_in_one_request(server: FakeServer) -> None:
    prompts = [f"obs {i} # Analyze:\n" for i in range(5)]
    client = make_client(server.url, max_tokens=7, seed=3)
    out = client.reflect(prompts)
    assert out == [f"about {p}".strip() for p in prompts]  # mapped by index, stripped
    assert len(server.completions) == 1
    body = server.completions[0]
    assert body["prompt"] == prompts
    assert body["model"] == MODEL and body["max_tokens"] == 7 and body["seed"] == 3
    assert body["temperature"] == 0.0 and body["stop"] == [" # Action", "\n\n"]
    assert (client.calls, client.requests, client.retries) == (5, 1, 0)
    assert client.completion_tokens == 15
    assert client.reflect(prompts[:2]) == out[:2]
    assert (client.calls, client.requests) == (7, 2)


def test_concurrent_mode_sends_one_request_per_prompt(server: FakeServer) -> None:
    prompts = [f"p{i}" for i in range(6)]
    client = make_client(server.url, mode="concurrent", max_concurrency=3)
    assert client.reflect(prompts) == [f"about {p}" for p in prompts]
    assert sorted(len(b["prompt"]) for b in server.completions) == [1] * 6
    assert sorted(b["prompt"][0] for b in server.completions) == prompts
    assert (client.calls, client.requests) == (6, 6)


def test_no_prompts_no_request(server: FakeServer) -> None:
    client = make_client(server.url)
    assert client.reflect([]) == []
    assert server.requests == [] and client.calls == 0


def test_retries_then_success(server: FakeServer, sleeps: list[float]) -> None:
    server.plan = [503, 500, "ok"]
    client = make_client(server.url, max_retries=3, backoff_s=0.5)
    assert client.reflect(["a", "b"]) == ["about a", "about b"]
    assert len(server.completions) == 3
    assert (client.requests, client.retries, client.calls) == (3, 2, 2)
    assert sleeps == [0.5, 1.0]  # exponential backoff


def test_retries_exhausted(server: FakeServer, sleeps: list[float]) -> None:
    server.plan = [502] * 10
    client = make_client(server.url, max_retries=2)
    with pytest.raises(ReflectionServerError) as info:
        client.reflect(["a"])
    message = str(info.value)
    assert "\n" not in message
    assert f"reflection server at {server.url} unreachable after 3 tries" in message
    assert "HTTP 502" in message and "scripted failure 502" in message
    assert message.endswith("start it or fix reflection.url")
    assert len(server.completions) == 3 and client.calls == 0


def test_connection_refused(sleeps: list[float]) -> None:
    url = closed_port_url()
    client = make_client(url, max_retries=1)
    with pytest.raises(ReflectionServerError, match="unreachable after 2 tries: Connect") as info:
        client.reflect(["a"])
    assert "\n" not in str(info.value) and url in str(info.value)
    assert client.requests == 2 and len(sleeps) == 1


@pytest.mark.parametrize("status", [400, 404, 422])
def test_client_errors_are_not_retried(
    server: FakeServer, sleeps: list[float], status: int
) -> None:
    server.plan = [status, "ok"]
    client = make_client(server.url, max_retries=3)
    with pytest.raises(ReflectionServerError, match=f"HTTP {status}: scripted failure") as info:
        client.reflect(["a"])
    assert "\n" not in str(info.value)
    assert len(server.completions) == 1 and sleeps == []


def test_rate_limit_is_retried(server: FakeServer, sleeps: list[float]) -> None:
    server.plan = [429, "ok"]
    assert make_client(server.url).reflect(["a"]) == ["about a"]
    assert len(server.completions) == 2


def test_timeout(server: FakeServer, sleeps: list[float]) -> None:
    server.plan = [("sleep", 2.0), ("sleep", 2.0)]
    client = make_client(server.url, timeout_s=0.2, max_retries=1)
    with pytest.raises(ReflectionServerError, match="unreachable after 2 tries: ReadTimeout"):
        client.reflect(["a"])
    assert len(server.completions) == 2


def test_timeout_then_success(server: FakeServer, sleeps: list[float]) -> None:
    server.plan = [("sleep", 2.0), "ok"]
    client = make_client(server.url, timeout_s=0.2, max_retries=1)
    assert client.reflect(["a"]) == ["about a"]


def test_missing_choice_is_an_error(server: FakeServer) -> None:
    server.plan = [("drop_index", 1)]
    with pytest.raises(ReflectionServerError, match="answered 2 of 3 prompts"):
        make_client(server.url).reflect(["a", "b", "c"])


def test_health(server: FakeServer) -> None:
    assert make_client(server.url).health()
    assert not ReflectionClient(server.url, "another-model").health()
    assert not make_client(closed_port_url()).health()


def test_pickles_after_use(server: FakeServer) -> None:
    client = make_client(server.url)
    client.reflect(["a"])
    clone = pickle.loads(pickle.dumps(client))
    assert clone.reflect(["b"]) == ["about b"]
    assert clone.calls == 2 and len(server.completions) == 2


def test_rejects_bad_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        ReflectionClient("http://127.0.0.1:1/v1", MODEL, mode="serial")  # type: ignore[arg-type]


def test_greedy_reflections_are_cached_and_each_distinct_prompt_is_sent_once(
    server: FakeServer,
) -> None:
    client = make_client(server.url, cache_size=3)
    first = client.reflect(["a", "b", "a", "c"])  # a twin in the batch is sent once
    assert first == ["about a", "about b", "about a", "about c"]
    assert server.completions[-1]["prompt"] == ["a", "b", "c"]
    assert client.reflect(["c", "d", "a"]) == ["about c", "about d", "about a"]
    assert server.completions[-1]["prompt"] == ["d"]  # c and a from the cache
    assert (client.calls, client.requests, client.cache_hits) == (7, 2, 3)
    # At most 3 kept, the least recently used dropped first: b went out when d came in.
    assert client.reflect(["b"]) == ["about b"] and server.completions[-1]["prompt"] == ["b"]
    assert client.reflect(["a", "a"]) == ["about a"] * 2 and len(server.completions) == 3


def test_sampled_reflections_are_never_cached(server: FakeServer) -> None:
    client = make_client(server.url, cache_size=100, temperature=0.7)
    client.reflect(["a", "a"])
    client.reflect(["a"])
    assert [b["prompt"] for b in server.completions] == [["a", "a"], ["a"]]
    assert client.cache_hits == 0


def test_quoted_commands_regex_admits_only_the_listed_commands_inside_quotes() -> None:
    import re

    from reflectrl.reflection.client import quoted_commands_regex

    regex = quoted_commands_regex(["cd ..", "cat core.py", "cd my-dir (old)", 'say "hi"', ""])
    assert regex == r'[^"]*("(cat core\.py|cd \.\.|cd my\-dir \(old\))"[^"]*)*'
    accepted = ['"cd .." went up. Now "cat core.py".', "no quote at all", '"cd my-dir (old)"']
    rejected = ['"cd ." is not one', 'Then "cat core.py', '"cat core.pyx"', '"say "hi""']
    assert all(re.fullmatch(regex, text) for text in accepted)
    assert not any(re.fullmatch(regex, text) for text in rejected)
    assert quoted_commands_regex([]) == '[^"]*'


def test_quotable_commands_go_one_prompt_per_request_with_their_regex(server: FakeServer) -> None:
    from reflectrl.reflection.client import quoted_commands_regex

    client = make_client(server.url, cache_size=10)
    commands = [["cd ..", "cat a.py"], ["cd b"], ["cd ..", "cat a.py"]]
    out = client.reflect(["p0", "p1", "p0"], commands)
    assert out == ["about p0", "about p1", "about p0"]
    bodies = sorted(server.completions, key=lambda b: b["prompt"])
    assert [b["prompt"] for b in bodies] == [["p0"], ["p1"]]  # the twin is sent once
    assert [b["structured_outputs"] for b in bodies] == [
        {"regex": quoted_commands_regex(commands[0])},
        {"regex": quoted_commands_regex(commands[1])},
    ]
    # The cache knows a prompt by its commands too: other commands, another request.
    client.reflect(["p0"], [["cd c"]])
    client.reflect(["p0"])
    assert len(server.completions) == 4 and "structured_outputs" not in server.completions[-1]
    assert client.reflect(["p0"], [["cd ..", "cat a.py"]]) == ["about p0"]
    assert len(server.completions) == 4 and client.cache_hits == 2

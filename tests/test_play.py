"""`reflectrl play`: the steps it records, how it prints them, and its page in headless Chromium.

The command itself, with a real reflection server on a finished run, is run at the end of
tests/test_launch_e2e.py's smoke pipeline.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from reflectrl.config import load_config
from reflectrl.evaluation.episodes import play
from reflectrl.evaluation.play import PlayedEpisode, format_episode, play_episodes
from reflectrl.evaluation.play_page import play_page
from reflectrl.models.policy import OptionPolicy
from reflectrl.rollout.vector_env import ReflectRLVectorEnv
from reflectrl.text.prompts import render_menu
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class ScriptedReflector:
    """Reflections that name the step they were asked at (and a snippet of markup, which the
    page must show as text)."""

    seed: int | None = None

    def __init__(self) -> None:
        self.calls = 0

    def reflect(self, prompts: list[str]) -> list[str]:
        self.calls += 1
        return [f"call {self.calls}: go <b>east</b> & </script>" for _ in prompts]


@pytest.fixture(scope="module")
def played(tiny_dir: Path, tokenizer: Any) -> tuple[list[PlayedEpisode], list[Any]]:
    """Three held-out Taxi episodes of a random tiny policy, greedy, and what the eval loop
    records for the same starts."""
    config = load_config(SMOKE, ["env.options.split=test", "env.options.max_steps=6"])
    env = ReflectRLVectorEnv(config, tokenizer, ScriptedReflector(), num_envs=1)
    env.set_stage("full")
    policy = OptionPolicy(tiny_dir, env.label_ids)
    starts = env.envs[0].start_ids("full")[:3]
    episodes = play_episodes(policy, env, 3, greedy=True, seed=5, starts=starts)
    again = ReflectRLVectorEnv(config, tokenizer, ScriptedReflector(), num_envs=1)
    again.set_stage("full")
    records = play(policy, again, 0, greedy=True, seed=5, starts=starts)
    return episodes, records


def test_play_records_every_step_as_the_eval_loop_plays_it(
    played: tuple[list[PlayedEpisode], list[Any]],
) -> None:
    episodes, records = played
    assert [e.start for e in episodes] == [r["start"] for r in records]
    for episode, record in zip(episodes, records, strict=True):
        # The same greedy choices as eval's loop: the same episodes, step for step.
        assert len(episode.steps) == record["length"]
        assert episode.success == record["success"]
        total = sum(s.reward for s in episode.steps)
        assert total == pytest.approx(record["episode_return"], abs=1e-5)
        assert episode.episode_return == pytest.approx(record["episode_return"])
        for step in episode.steps:
            assert len(step.menu) == len(step.labels) == len(step.probabilities) == 6
            assert sum(step.probabilities) == pytest.approx(1.0, abs=1e-5)
            assert 0 <= step.action < 6 and step.reflection is not None
            assert step.reflection.startswith("call ")
            assert "+---------+" in step.observation
    first = episodes[0].steps[0]
    assert first.labels == ("1", "2", "3", "4", "5", "6")  # policy.labels
    assert set(first.menu) == {"go south", "go north", "go east", "go west",
                               "pick up passenger", "drop off passenger"}  # fmt: skip
    # Each step shows the reflection asked for it: one call per step, in order.
    calls = [int(s.reflection.split()[1].rstrip(":")) for e in episodes for s in e.steps]
    assert calls == sorted(calls) and len(set(calls)) == len(calls)


def test_the_text_shows_the_menu_probabilities_and_the_action_taken(
    played: tuple[list[PlayedEpisode], list[Any]],
) -> None:
    episode = played[0][0]
    text = format_episode(1, 3, episode)
    step = episode.steps[0]
    taken = step.action
    marked = [line for line in text.splitlines() if line.startswith("    -> ")]
    assert len(marked) == len(episode.steps)
    assert marked[0].startswith(f"    -> {step.labels[taken]}. {step.menu[taken]}")
    assert f"p={step.probabilities[taken]:.3f}" in marked[0]
    assert f"action {step.labels[taken]}. {step.menu[taken]}, reward {step.reward:+.2f}" in text
    assert text.splitlines()[0].startswith(f"episode 1/3: stage full, start {episode.start}: ")
    assert "    | +---------+" in text
    assert text.splitlines()[1].startswith("  task: You drive a taxi on a 5x5 grid.")


def test_the_page_steps_through_the_episodes_in_headless_chromium(
    played: tuple[list[PlayedEpisode], list[Any]], tmp_path: Path
) -> None:
    """Open the page, step forward, screenshot: the counter, the action and the grid."""
    from playwright.sync_api import sync_playwright

    episodes = played[0]
    page_file = tmp_path / "play.html"
    page_file.write_text(play_page("a run: stage full", [asdict(e) for e in episodes]))
    assert '</script>", ' not in page_file.read_text()  # the reflection's markup is escaped
    assert Path(CHROMIUM).is_file(), "headless Chromium is needed: apt-get install chromium"
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=flags)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(page_file.as_uri())
            first = episodes[0]
            n = len(first.steps)
            assert page.inner_text("#counter") == f"step 1 / {n}"
            assert page.is_disabled("#prev")
            page.click("#next")
            second = first.steps[1] if n > 1 else episodes[1].steps[0]
            expected_counter = f"step 2 / {n}" if n > 1 else f"step 1 / {len(episodes[1].steps)}"
            assert page.inner_text("#counter") == expected_counter
            action = page.inner_text("#action")
            assert action == f"{second.labels[second.action]}. {second.menu[second.action]}"
            assert page.inner_text("#menu tr.taken").split("\t")[2] == second.menu[second.action]
            # The map as a table: 7 rows of 11 cells; the reflection as text, not markup.
            assert page.locator("table.grid tr").count() == 7
            assert page.locator("table.grid tr").nth(1).locator("td").count() == 11
            assert page.inner_text("#reflection") == second.reflection
            assert page.inner_text("#task").startswith("You drive a taxi")
            assert page.locator("#reflection b").count() == 0
            page.screenshot(path=str(tmp_path / "step2.png"))
            assert errors == []
        finally:
            browser.close()
    png = (tmp_path / "step2.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000


def test_the_page_refuses_an_empty_episode() -> None:
    with pytest.raises(ValueError, match="at least one step"):
        play_page("t", [{"steps": []}])


def test_play_cli_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(SMOKE.read_text())
    cases = [
        ([str(tmp_path)], "no config.yaml there"),
        ([str(tmp_path / "run"), "--episodes", "0"], "--episodes 0: need at least 1"),
        ([str(tmp_path / "run"), "--html", str(tmp_path / "no" / "p.html")], "existing folder"),
        ([str(tmp_path / "run")], "no finished policy (stage rl has not finished)"),
    ]
    for args, message in cases:
        done = run_cli("play", *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_step_views_follow_the_shuffled_menu(tiny_dir: Path, tokenizer: Any) -> None:
    """`last_views` lists the menu in the order the prompt shows it (shuffled menus too)."""
    config = load_config(SMOKE, ["reflection.enabled=false", "env.shuffle_options=true"])
    env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=2)
    env.reset(seed=0)
    for i, view in enumerate(env.last_views):
        shown = render_menu(view.menu, env.labels, list(range(len(view.menu))))
        assert shown in env.last_prompts[i] and view.reflection is None
    canonical = ("go south", "go north", "go east", "go west", "pick up passenger",
                 "drop off passenger")  # fmt: skip
    assert any(v.menu != canonical for v in env.last_views)

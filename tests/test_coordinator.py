"""The curriculum decision: aggregated success over a window, thresholds, caps, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflectrl.config import CurriculumConfig, StageConfig
from reflectrl.errors import ConfigError
from reflectrl.rl.curriculum import Curriculum

STAGES = ("pickup", "dropoff", "full")


def episodes(stage: str, successes: list[bool]) -> list[dict]:
    return [{"stage": stage, "success": s, "episode_return": 0.0, "length": 1} for s in successes]


def make(**kw: object) -> Curriculum:
    config = CurriculumConfig(
        stages=[
            StageConfig(name="pickup", success_threshold=0.75),
            StageConfig(name="dropoff", success_threshold=0.5, max_iterations=3),
            StageConfig(name="full"),
        ],
        window=8,
        min_episodes=4,
        **kw,
    )
    return Curriculum(config, STAGES)


def test_advances_when_the_window_passes_the_bar() -> None:
    c = make()
    c.observe(episodes("pickup", [True, True, False]))  # 3 < min_episodes
    assert c.end_iteration() is None
    c.observe(episodes("pickup", [False]))  # 2/4 = 0.5 < 0.75
    assert c.end_iteration() is None
    c.observe(episodes("pickup", [True] * 4))  # last 8: 6/8 = 0.75
    assert c.success_rate == pytest.approx(0.75)
    assert c.end_iteration() == "dropoff" and c.stage == "dropoff"
    assert c.success_rate == 0.0  # a new stage starts a new window


def test_success_is_aggregated_across_workers_and_old_stage_episodes_ignored() -> None:
    c = make()
    worker_a = episodes("pickup", [True, True])
    worker_b = episodes("pickup", [True, False])
    c.observe(worker_a + worker_b)
    assert c.success_rate == pytest.approx(0.75)
    c.observe(episodes("pickup", [True] * 4))
    assert c.end_iteration() == "dropoff"
    c.observe(episodes("pickup", [False] * 10))  # episodes that began before the switch
    assert c.episodes_in_stage == 0 and c.success_rate == 0.0


def test_iteration_cap_is_a_fallback_and_last_stage_is_final() -> None:
    c = make()
    c.load_state_dict({**c.state_dict(), "stage": "dropoff"})
    for _ in range(2):
        assert c.end_iteration() is None
    assert c.end_iteration() == "full"
    c.observe(episodes("full", [True] * 20))
    assert c.end_iteration() is None and c.stage == "full"


def test_state_round_trips() -> None:
    c = make()
    c.observe(episodes("pickup", [True] * 8))
    c.end_iteration()
    c.observe(episodes("dropoff", [True, False]))
    c.end_iteration()
    restored = make()
    restored.load_state_dict(c.state_dict())
    assert restored.state_dict() == c.state_dict()
    with pytest.raises(ValueError, match="not in"):
        restored.load_state_dict({**c.state_dict(), "stage": "nope"})


def test_disabled_curriculum_trains_on_the_last_stage() -> None:
    c = make(enabled=False)
    assert c.stage == "full"
    c.observe(episodes("full", [True] * 8))
    assert c.end_iteration() is None


def test_defaults_to_the_envs_stages_and_rejects_unknown() -> None:
    assert Curriculum(CurriculumConfig(), STAGES).stage == "pickup"
    with pytest.raises(ConfigError, match="unknown stage 'nope'"):
        Curriculum(CurriculumConfig(stages=[StageConfig(name="nope")]), STAGES)


@pytest.mark.integration
def test_a_stage_that_is_never_passed_ends_at_its_cap(tmp_path: Path) -> None:
    """Thresholds no run can pass (success 1.0 over a window): the caps alone move the real
    coordinator (RLlib callback, 2 rollout workers) through every stage, one iteration each,
    and every worker plays the new stage from the next iteration on, reviewing the ones passed."""
    import ray

    from reflectrl.config import load_config
    from reflectrl.rl.driver import Run

    repo = Path(__file__).resolve().parents[1]
    config = load_config(
        repo / "configs" / "smoke.yaml",
        [
            "reflection.enabled=false",
            "curriculum.stages=[{name: pickup, success_threshold: 1.0, max_iterations: 1},"
            " {name: dropoff, success_threshold: 1.0, max_iterations: 2}, {name: full}]",
            "curriculum.window=1000",
            "curriculum.min_episodes=1000",
            "curriculum.review=0.5",
        ],
    )
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    run = Run(config, tmp_path / "run", workers=2)
    try:
        run.start()
        rows = [run.train_iteration() for _ in range(4)]
        worker_stages = run.coordinator.push_stage(run.algo.env_runner_group)
    finally:
        run.close()
        ray.shutdown()
    assert [r["stage"] for r in rows] == ["pickup", "dropoff", "dropoff", "full"]
    assert [r["next_stage"] for r in rows] == ["dropoff", "dropoff", "full", "full"]
    assert all(r["success_rate"] < 1.0 for r in rows)  # no bar was passed
    assert worker_stages == ["full", "full"]
    # Review: from the second stage on, about half the episodes replay a stage already passed
    # (none can in the first); they never count toward the bar.
    # Iteration 3 (dropoff's second) holds no episode begun in pickup (they last <= 12 steps,
    # an iteration is 16 per env): its pickup episodes are all review.
    print(
        "episodes, earlier-stage episodes:",
        [(r["episodes"], r["earlier_stage_episodes"]) for r in rows],
    )
    assert rows[0]["earlier_stage_episodes"] == 0
    for row in rows[2:]:
        assert 0.2 * row["episodes"] <= row["earlier_stage_episodes"] <= 0.8 * row["episodes"]


def test_review_stages_are_the_ones_passed() -> None:
    c = make(review=0.25)
    assert c.review_stages == () and c.review_share == 0.25
    c.observe(episodes("pickup", [True] * 8))
    assert c.end_iteration() == "dropoff" and c.review_stages == ("pickup",)
    c.observe(episodes("pickup", [False] * 8))  # review episodes: not in the window
    c.observe(episodes("dropoff", [True] * 4))
    assert c.success_rate == 1.0
    assert c.end_iteration() == "full" and c.review_stages == ("pickup", "dropoff")
    with pytest.raises(ValueError, match="less than 1"):
        CurriculumConfig(review=1.0)


class _OneWorker:
    """The slice of RLlib's EnvRunnerGroup the coordinator calls: one healthy worker."""

    def __init__(self) -> None:
        self.pushed: list[str] = []

    def healthy_worker_ids(self) -> list[int]:
        return [1]

    def foreach_env_runner(self, calls: list, **kwargs: object) -> list[str]:
        self.pushed += [call.keywords["stage"] for call in calls]
        return self.pushed


def test_the_row_reports_the_success_of_the_stage_played_when_the_stage_switches() -> None:
    """A stage switch clears the window; the iteration's row still reports the success rate
    of the stage it played (a switch after pickup's one iteration once reported 0.00)."""
    from types import SimpleNamespace

    from reflectrl.rl.coordinator import CoordinatorCallback
    from reflectrl.rollout.seams import zero_counts

    coordinator = CoordinatorCallback()
    coordinator.curriculum = make()
    coordinator.curriculum.stages[0].max_iterations = 1
    played = [{**e, "step_limit": False} for e in episodes("pickup", [True, True, False, True])]
    counts = {**zero_counts(), "env_steps": 4}
    stats = {"worker_index": 1, "random_state": {}, "stage": "pickup", "episodes": played, **counts}
    group = _OneWorker()
    algorithm = SimpleNamespace(sampled_stats=[stats], env_runner_group=group)
    result: dict = {}
    coordinator.on_train_result(algorithm=algorithm, result=result)
    report = result["reflectrl"]
    assert (report["stage"], report["next_stage"], group.pushed) == (
        "pickup",
        "dropoff",
        ["dropoff"],
    )
    assert report["success_rate"] == pytest.approx(0.75)

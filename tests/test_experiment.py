"""`reflectrl experiment`: the grid, its resumption, its report and plots."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from reflectrl.errors import ConfigError
from reflectrl.experiment.grid import load_spec, plan, status
from reflectrl.experiment.results import mean_ci95, t95
from tests.helpers import png_size, run_cli

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke.yaml")
# Smoke-size and no reflection server: data (4 episodes), 2 SFT steps, 1 RL iteration or none,
# 1 held-out episode per decoding.
SHORT = [
    "data.episodes=4",
    "sft.max_steps=2",
    "run.iterations=1",
    "eval.episodes=1",
    "reflection.enabled=false",
]


XDIST_SPREAD = True  # no module fixtures: its tests may run in different test processes


def write_spec(path: Path, variants: dict[str, list[str]], seeds: list[int]) -> Path:
    import yaml

    spec = {"base": SMOKE, "set": SHORT, "seeds": seeds, "variants": variants}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_t_interval_over_seeds() -> None:
    assert mean_ci95([]) == {"n": 0, "mean": None, "ci95": None}
    assert mean_ci95([0.5]) == {"n": 1, "mean": 0.5, "ci95": None}
    stat = mean_ci95([0.8, 0.9, 1.0])  # sd 0.1, t(2) = 4.303
    assert stat["mean"] == pytest.approx(0.9)
    assert stat["ci95"] == pytest.approx([0.9 - 4.303 * 0.1 / 3**0.5, 0.9 + 4.303 * 0.1 / 3**0.5])
    assert t95(11) == t95(10) and t95(100) == 1.96
    assert mean_ci95([0.8, 0.9, 1.0], (0.0, 1.0))["ci95"] == pytest.approx([0.6516, 1.0], abs=1e-4)


def test_bad_experiment_files_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: configs/nope.yaml\nvariants: {a: []}\n")
    with pytest.raises(ConfigError, match=r"base configs/nope\.yaml does not exist"):
        load_spec(bad)
    bad.write_text(f"base: {SMOKE}\nvariants: {{'a b': []}}\n")
    with pytest.raises(ConfigError, match="variant name 'a b'"):
        load_spec(bad)
    bad.write_text(f"base: {SMOKE}\nvariants: {{a: [ppo.nope=1]}}\n")
    with pytest.raises(ConfigError, match="nope"):
        plan(load_spec(bad), tmp_path / "out")  # every config is checked before any run
    result = run_cli("experiment", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    good = write_spec(tmp_path / "good.yaml", {"a": [], "b": []}, [0])
    result = run_cli("experiment", str(good), "--variants", "a,nope")
    assert result.returncode == 2 and "--variants: nope not in" in result.stderr
    assert "(it has a, b)" in result.stderr
    assert not (REPO / "experiments" / "runs" / "good").exists()  # nothing started


def test_a_run_dir_of_other_settings_is_refused_and_kept(tmp_path: Path) -> None:
    from reflectrl.config import dump_config, load_config

    spec = load_spec(write_spec(tmp_path / "e.yaml", {"a": []}, [0]))
    (run,) = plan(spec, tmp_path / "out")
    assert status(run, spec.base) == "new"
    run.dir.mkdir(parents=True)
    config = load_config(spec.base, run.overrides)
    (run.dir / "config.yaml").write_text(dump_config(config))
    assert status(run, spec.base) == "resume"  # started, no stage finished
    # A run from before a key existed: its config.yaml lacks it; at its default, no change.
    older = yaml.safe_load(dump_config(config))
    del older["ppo"]["max_staleness"]
    (run.dir / "config.yaml").write_text(yaml.safe_dump(older))
    assert status(run, spec.base) == "resume"
    other = dump_config(load_config(spec.base, [*run.overrides, "ppo.lr=0.5"]))
    (run.dir / "config.yaml").write_text(other)
    with pytest.raises(ConfigError, match="other settings"):
        status(run, spec.base)
    assert (run.dir / "config.yaml").read_text() == other


@pytest.mark.integration
def test_tiny_grid_writes_its_report_and_skips_finished_runs(tmp_path: Path) -> None:
    variants = {"sft_only": ["rl.enabled=false"], "rl": []}
    spec_file = write_spec(tmp_path / "tiny_grid.yaml", variants, [0])
    out = tmp_path / "out"
    # --report-only starts nothing: every run is reported as not finished.
    result = run_cli("experiment", str(spec_file), "--output", str(out), "--report-only")
    assert result.returncode == 0, result.stderr[-3000:]
    empty = json.loads((out / "results.json").read_text())
    assert [r["finished"] for r in empty["runs"]] == [False] * 2
    assert empty["variants"]["rl"]["missing_seeds"] == [0]
    assert "| rl | 0 (1 missing) | n/a |" in (out / "results.md").read_text()
    assert not (out / "rl-seed0").exists()

    result = run_cli("experiment", str(spec_file), "--output", str(out), timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 variants x 1 seeds = 2 runs" in result.stdout
    names = ["sft_only-seed0", "rl-seed0"]
    for name in names:
        assert (out / name / "stages" / "eval.json").is_file()
        assert (out / "logs" / f"{name}.log").stat().st_size > 0
        assert f"[{name}] [stage 1/" in result.stdout  # each run's progress, prefixed

    # The RL run of each seed starts from the SFT-only run's data and SFT (same settings).
    for seed in (0,):
        assert f"rl-seed{seed}: data and SFT shared with sft_only-seed{seed}" in result.stdout
        marker = json.loads((out / f"rl-seed{seed}" / "stages" / "sft.json").read_text())
        assert marker["shared_from"] == f"sft_only-seed{seed}"
        assert (out / f"rl-seed{seed}" / "sft" / "policy" / "sft_result.json").is_file()

    results = json.loads((out / "results.json").read_text())
    assert set(results["variants"]) == set(variants)
    for run in results["runs"]:
        report = json.loads((out / f"{run['variant']}-seed{run['seed']}" / "eval_test.json")
                            .read_text())  # fmt: skip
        assert run["success_greedy"] == report["greedy"]["all"]["success_rate"]
        assert run["success_sampled"] == report["sampled"]["all"]["success_rate"]
        assert run["return_greedy"] == report["greedy"]["all"]["return_mean"]
    for name, stat in results["variants"].items():
        mine = [r for r in results["runs"] if r["variant"] == name]
        mean = sum(r["success_greedy"] for r in mine) / len(mine)
        assert stat["success_greedy"]["mean"] == pytest.approx(mean)
        assert stat["success_greedy"]["n"] == 1
        table_row = next(
            line for line in (out / "results.md").read_text().splitlines()
            if line.startswith(f"| {name} |")
        )  # fmt: skip
        assert f"| {mean:.2f}" in table_row
    rl_runs = [r for r in results["runs"] if r["variant"] == "rl"]
    assert all(r["env_steps"] > 0 and r["rl_iterations"] == 1 for r in rl_runs)
    assert all(r["env_steps"] == 0 for r in results["runs"] if r["variant"] == "sft_only")
    for plot in ("heldout_success.png", "curriculum.png"):
        assert png_size(out / "plots" / plot) == (800, 450)
    # 420 px per panel: training success and return (no eval.every, no held-out panel).
    assert png_size(out / "plots" / "learning_curves.png") == (840, 420)
    md = (out / "results.md").read_text()
    assert "![plots/heldout_success.png](plots/heldout_success.png)" in md
    assert re.search(r"Commit: `[0-9a-f]{40}`", md)

    # A second call starts nothing: every run is finished.
    again = run_cli("experiment", str(spec_file), "--output", str(out), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished earlier; skipped") == 2
    assert "run 1/" not in again.stdout

    # --export keeps what the report reads (no models, data or checkpoints), and the report
    # rebuilt from that copy alone has the same figures.
    kept = tmp_path / "kept"
    result = run_cli("experiment", str(spec_file), "--output", str(out), "--report-only",
                     "--export", str(kept))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "exported 2 runs" in result.stdout
    files = {str(p.relative_to(kept / "rl-seed0")) for p in (kept / "rl-seed0").rglob("*")}
    assert {"config.yaml", "metrics.jsonl", "eval_test.json", "stages/eval.json"} <= files
    assert not any(f.startswith(("sft", "data", "checkpoints")) for f in files)
    rebuilt = run_cli("experiment", str(spec_file), "--output", str(kept), "--report-only")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    again = json.loads((kept / "results.json").read_text())
    assert again["variants"] == results["variants"]
    refused = run_cli("experiment", str(spec_file), "--output", str(out), "--report-only",
                      "--export", str(out))  # fmt: skip
    assert refused.returncode == 2 and "is the runs' own folder" in refused.stderr


def test_plots_mark_stage_switches_and_show_held_out_success(tmp_path: Path) -> None:
    from reflectrl.experiment.plots import learning_curves, stage_switches

    rows = [
        {"env_steps": 100 * i, "stage": s, "next_stage": n, "success_rate": 0.1 * i,
         "episode_return_mean": 0.0, **({"eval_success_rate": 0.2 * i} if i % 2 else {})}
        for i, (s, n) in enumerate(
            [("pickup", "pickup"), ("pickup", "full"), ("full", "full"), ("full", "full")]
        )
    ]  # fmt: skip
    assert stage_switches(rows) == [(100, "full")]
    path = learning_curves({"run": [rows]}, tmp_path / "curves.png")
    assert path.stat().st_size > 1000


def test_held_out_curve_and_its_mean_over_env_steps(tmp_path: Path) -> None:
    from reflectrl.experiment.results import curve_mean, heldout_curve

    rows = [
        {"iteration": 1, "env_steps": 5, "stage": "pickup"},
        {"iteration": 2, "env_steps": 10, "stage": "full", "eval_success_rate": 1.0},
        {"iteration": 3, "env_steps": 20, "stage": "full", "eval_success_rate": 0.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = {"iteration": 0, "env_steps": 0, "eval_success_rate": 0.5}
    (tmp_path / "eval_before_rl.json").write_text(json.dumps(before))
    curve = heldout_curve(tmp_path)
    assert curve == [[0.0, 0.5], [10.0, 1.0], [20.0, 0.0]]
    assert curve_mean(curve) == pytest.approx((10 * 0.75 + 10 * 0.5) / 20)
    assert curve_mean([[0.0, 0.3]]) is None


def test_detail_table_averages_each_figure_over_the_seeds_that_have_it() -> None:
    from reflectrl.experiment.results import detail_table

    runs = [
        {"variant": "rl", "finished": True, "success_greedy_by_stage": {"full": 0.5, "pickup": 1.0},
         "success_before_rl_greedy": 0.2, "heldout_curve_mean": 0.4},
        {"variant": "rl", "finished": True, "success_greedy_by_stage": {"full": 0.3, "pickup": 0.0},
         "success_before_rl_greedy": 0.4, "success_greedy_unseen_states": 0.25},
        {"variant": "rl", "finished": False},
        {"variant": "sft", "finished": True, "success_greedy_by_stage": {"full": 0.9},
         "success_greedy_by_split": {"unseen": 0.1}},
    ]  # fmt: skip
    lines = detail_table(runs).splitlines()
    assert lines[0] == (
        "| variant | pickup | full | before RL | curve mean | on unseen states | unseen split |"
    )  # the curriculum's order, not the alphabet's; then each of eval.extra_splits
    assert lines[2] == ("| rl | 0.500 (2) | 0.400 (2) | 0.300 (2) | 0.400 (1) | 0.250 (1) | n/a |")
    assert lines[3] == "| sft | n/a | 0.900 (1) | n/a | n/a | n/a | 0.100 (1) |"


def test_runs_that_differ_only_in_rl_settings_share_their_data_and_sft() -> None:
    from reflectrl.config import load_config
    from reflectrl.experiment.grid import warm_start_key

    def key(*overrides: str) -> str | None:
        return warm_start_key(load_config(SMOKE, list(overrides)))

    lora = ["policy.lora.r=32", "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj]"]
    assert key("sft.method=full") == key("sft.method=full", *lora)  # RL's LoRA only
    assert key("sft.method=full") == key("sft.method=full", "ppo.lr=0.5", "eval.every=3")
    assert key("sft.method=full") == key("sft.method=full", "curriculum.review=0.25")
    # A stage's bar and cap are RL's; which stages there are is the data's.
    capped = "curriculum.stages=[{name: pickup, max_iterations: 1}, {name: full}]"
    assert key(capped) == key("curriculum.stages=[{name: pickup, success_threshold: 0.2}, "
                              "{name: full}]")  # fmt: skip
    assert key(capped) != key("curriculum.stages=[{name: full}]")
    rl = ["policy.rl_trainable=full", "rl.advantage=gigpo", "ppo.batch_mode=complete_episodes"]
    assert key("sft.method=full") == key("sft.method=full", *rl, "rl.group_size=2")
    assert key("sft.method=lora") != key("sft.method=lora", *lora)  # the SFT adapter's shape
    assert key("sft.method=full") != key("sft.method=full", "data.episodes=7")
    assert key("sft.enabled=false") is None


@pytest.mark.parametrize(
    "path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_experiment_files_plan_valid_configs(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # bases are relative to the repository root
    runs = plan(load_spec(path), tmp_path)
    assert len(runs) >= 3 and len({r.dir for r in runs}) == len(runs)

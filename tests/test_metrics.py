"""metrics.jsonl on resume: rows after the checkpoint are dropped, a crash-cut line too."""

from __future__ import annotations

import json
from pathlib import Path

from reflectrl.rl.metrics import keep_rows_up_to


def test_rows_after_the_checkpoint_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"iteration": i, "env_steps": 64 * i}) for i in (1, 2, 3)]
    path.write_text("\n".join(rows) + '\n{"iteration": 4, "env_st')  # cut by a crash
    keep_rows_up_to(path, 2)
    assert [json.loads(line)["iteration"] for line in path.read_text().splitlines()] == [1, 2]
    before = path.read_text()
    keep_rows_up_to(path, 2)  # nothing to drop: the file is left alone
    assert path.read_text() == before
    keep_rows_up_to(tmp_path / "missing.jsonl", 1)  # a run without metrics yet

"""The page of `reflectrl play --html`: one self-contained HTML file that steps through episodes.

The episodes travel as JSON inside the page and are drawn with `textContent` only, so nothing an
env, a model or a task file wrote is ever parsed as HTML. An observation's grid (lines that
start and end with `+` or `|`, as Taxi draws its map) is drawn as a table of cells.
"""

from __future__ import annotations

import html
import json
from typing import Any

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 62em; }
h1 { font-size: 1.2em; }
#controls { display: flex; gap: .6em; align-items: center; margin: .8em 0; }
#controls button { font-size: 1em; padding: .2em .9em; }
#counter { font-weight: 600; min-width: 8em; }
pre { background: #f6f6f6; padding: .6em; margin: .3em 0; white-space: pre-wrap; }
table.grid { border-collapse: collapse; margin: .3em 0; font-family: monospace; }
table.grid td { width: 1.7em; height: 1.7em; text-align: center; border: 1px solid #ddd; }
table.grid td.sep { width: .5em; }
table.grid td.wall { background: #444; color: #fff; }
table.grid td.agent { background: #f4c430; font-weight: 700; }
table.grid td.goal { background: #9fd39f; font-weight: 700; }
table.grid td.item { background: #9cc3f0; font-weight: 700; }
#reflection { background: #eef4ff; padding: .6em; border-left: 3px solid #5b8def; }
table.menu { border-collapse: collapse; margin: .3em 0; }
table.menu td { padding: .15em .6em; }
table.menu tr.taken { background: #fff3c4; font-weight: 600; }
.bar { display: inline-block; height: .8em; background: #5b8def; vertical-align: middle; }
.label { color: #666; font-size: .85em; text-transform: uppercase; margin-top: .9em; }
"""

_SCRIPT = r"""
const data = JSON.parse(document.getElementById("episodes").textContent);
let episode = 0, step = 0;
const $ = (id) => document.getElementById(id);
const CELL = { "|": "wall", "-": "wall", "+": "wall", T: "agent", X: "agent",
               P: "item", D: "goal" };

function isGridLine(line) { return /^[+|].*[+|]$/.test(line); }

function drawObservation(text) {
  const box = $("observation");
  box.replaceChildren();
  let pending = [], table = null;
  const flushText = () => {
    if (pending.length) {
      const pre = document.createElement("pre");
      pre.textContent = pending.join("\n");
      box.appendChild(pre);
      pending = [];
    }
  };
  for (const line of text.split("\n")) {
    if (!isGridLine(line)) { table = null; pending.push(line); continue; }
    flushText();
    if (table === null) {
      table = document.createElement("table");
      table.className = "grid";
      box.appendChild(table);
    }
    const row = table.insertRow();
    [...line].forEach((ch, col) => {
      const cell = row.insertCell();
      cell.textContent = ch === "." ? "" : ch;
      const kind = CELL[ch] || "";
      cell.className = (col % 2 === 0 && kind !== "wall") ? "sep " + kind : kind;
    });
  }
  flushText();
}

function outcome(ep) {
  return ep.success ? "success" : (ep.step_limit ? "step limit" : "failure");
}

function show() {
  const ep = data.episodes[episode], s = ep.steps[step];
  $("episode").value = String(episode);
  $("episode-summary").textContent = "stage " + ep.stage +
    (ep.start ? ", start " + ep.start : "") + ": " + outcome(ep) + ", return " +
    ep.episode_return.toFixed(2) + ", " + ep.steps.length + " steps";
  $("task").textContent = ep.instruction;
  $("counter").textContent = "step " + (step + 1) + " / " + ep.steps.length;
  drawObservation(s.observation);
  $("reflection-block").hidden = s.reflection === null;
  $("reflection").textContent = s.reflection === null ? "" : s.reflection;
  const menu = $("menu");
  menu.replaceChildren();
  s.menu.forEach((action, i) => {
    const row = menu.insertRow();
    if (i === s.action) row.className = "taken";
    row.insertCell().textContent = i === s.action ? "\u2192" : "";
    row.insertCell().textContent = s.labels[i] + ".";
    row.insertCell().textContent = action;
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = (s.probabilities[i] * 12).toFixed(2) + "em";
    const p = row.insertCell();
    p.appendChild(bar);
    p.appendChild(document.createTextNode(" " + s.probabilities[i].toFixed(3)));
  });
  $("action").textContent = s.labels[s.action] + ". " + s.menu[s.action];
  $("reward").textContent = (s.reward >= 0 ? "+" : "") + s.reward.toFixed(2);
  $("prev").disabled = episode === 0 && step === 0;
  const last = data.episodes.length - 1;
  $("next").disabled = episode === last && step === data.episodes[last].steps.length - 1;
}

function move(by) {
  step += by;
  if (step >= data.episodes[episode].steps.length && episode < data.episodes.length - 1) {
    episode += 1; step = 0;
  } else if (step < 0 && episode > 0) {
    episode -= 1; step = data.episodes[episode].steps.length - 1;
  }
  step = Math.max(0, Math.min(step, data.episodes[episode].steps.length - 1));
  show();
}

data.episodes.forEach((ep, i) => {
  const option = document.createElement("option");
  option.value = String(i);
  option.textContent = "episode " + (i + 1) + " / " + data.episodes.length + " (" +
    outcome(ep) + ")";
  $("episode").appendChild(option);
});
$("episode").addEventListener("change", (e) => {
  episode = Number(e.target.value); step = 0; show();
});
$("prev").addEventListener("click", () => move(-1));
$("next").addEventListener("click", () => move(1));
document.addEventListener("keydown", (e) => {
  if (e.key === "ArrowRight") move(1);
  if (e.key === "ArrowLeft") move(-1);
});
show();
"""


def play_page(title: str, episodes: list[dict[str, Any]]) -> str:
    """The page: `episodes` are `PlayedEpisode`s as dicts (dataclasses.asdict)."""
    if not episodes or not all(e["steps"] for e in episodes):
        raise ValueError("the page needs at least one episode, each with at least one step")
    # Inside <script>, "</script>" or "<!--" in the data would end or bend the element: JSON
    # lets every "<", ">" and "&" be written as an escape instead.
    payload = (
        json.dumps({"episodes": episodes})
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<div id="controls">
  <select id="episode" aria-label="episode"></select>
  <button id="prev" aria-label="previous step">&larr; prev</button>
  <span id="counter"></span>
  <button id="next" aria-label="next step">next &rarr;</button>
</div>
<div id="episode-summary"></div>
<div class="label">task</div>
<div id="task"></div>
<div class="label">observation</div>
<div id="observation"></div>
<div id="reflection-block">
  <div class="label">reflection</div>
  <div id="reflection"></div>
</div>
<div class="label">menu: the policy's probability of each action</div>
<table class="menu" id="menu"></table>
<div class="label">step</div>
<div>action <b id="action"></b>, reward <b id="reward"></b></div>
<script type="application/json" id="episodes">{payload}</script>
<script>{_SCRIPT}</script>
</body>
</html>
"""

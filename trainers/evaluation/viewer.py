"""`venus-gym view FILE -o page.html`: a static HTML page to read trajectories in a browser.

    write_viewer("runs/eval/results.jsonl", "page.html")          # venus-gym eval results
    write_viewer("runs/igpo/samples/step-000010.jsonl", "page.html")  # RL samples

Input: any trajectory JSONL (trainers.trajectory: `venus-gym eval`'s results.jsonl, the RL
logger's samples/step-*.jsonl, SFT data). Output: one self-contained file (inline CSS and JS,
the trajectories embedded as JSON, no server, no network: a Content-Security-Policy forbids
any fetch), with

* a task list filtered by outcome (correct / wrong), hop count, format errors and free
  text; the filter lives in the URL hash (`#outcome=wrong&hops=2&format=errors&q=paris`),
  so a filtered view can be bookmarked or opened directly;
* per trajectory its turns: reasoning (`<think>`), tool calls, answers and the tool
  responses in distinct colours, each turn's kind, information gain, outcome / format
  reward, total reward and advantage when the file carries them (`turn_advantages` or
  `advantages` in the trajectory's metadata, one number per turn), and malformed turns
  marked with the parser's reason.

Safety: every string reaches the page as data. The JSON is embedded in a
`<script type="application/json">` block with `<`, `>` and `&` written as \\u escapes (so a
trajectory holding `</script>` cannot close the block), and the page's script builds the DOM
with textContent only, never innerHTML, so `<img onerror=...>` in a trajectory is shown as
text and never runs.

Correct means outcome >= 0.5 (trainers.evaluation.metrics.CORRECT_THRESHOLD), or the evaluation's
own flag when the file has one.

Odd input: a line that is not a JSON object, or a record the page cannot show (messages,
turns or metadata that are not objects), is skipped; how many and why is said on the page
and on stderr. The page is written under a temporary name and renamed when complete, so a
failure never leaves a partial page. A URL fragment that does not decode is ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainers.evaluation.metrics import CORRECT_THRESHOLD
from venus_gym.jsonl import atomic_output, iter_json_lines

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """(JSON objects of the file's lines, "line N: why" for each line skipped)."""
    records, skipped = [], []
    for line in iter_json_lines(path, allow_lone_surrogates=True):  # splits at "\n" only
        if line.record is None:
            skipped.append(f"line {line.lineno}: {line.problem}")
        else:
            records.append(line.record)
    return records, skipped


def shape_problem(record: Mapping[str, Any]) -> str:
    """Why the page cannot show `record` ("" when it can): the fields it reads must be
    objects, or lists of objects."""
    for key in ("messages", "turns"):
        items = record.get(key) or []
        if not isinstance(items, list):
            return f"'{key}' must be a list of objects, got {type(items).__name__}"
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                return f"'{key}[{index}]' must be an object, got {type(item).__name__}"
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        return f"'metadata' must be an object, got {type(metadata).__name__}"
    if not isinstance(metadata.get("eval") or {}, dict):
        return f"'metadata.eval' must be an object, got {type(metadata['eval']).__name__}"
    if not isinstance(record.get("answers") or [], list):
        return f"'answers' must be a list, got {type(record['answers']).__name__}"
    return ""


def split_turn(text: str) -> list[dict[str, str]]:
    """The parts of an assistant turn, in order: think / call / answer / text."""
    parts: list[dict[str, str]] = []
    spans = sorted([(m.start(), m.end(), kind, m.group(1)) for pattern, kind in
                    ((_THINK, "think"), (_TOOL_CALL, "call"), (_ANSWER, "answer"))
                    for m in pattern.finditer(text)])
    at = 0
    for start, end, kind, body in spans:
        if start < at:
            continue  # a tag inside another part stays in that part
        if text[at:start].strip():
            parts.append({"kind": "text", "text": text[at:start].strip()})
        parts.append({"kind": kind, "text": body.strip()})
        at = end
    if text[at:].strip():
        parts.append({"kind": "text", "text": text[at:].strip()})
    return parts


def view_item(record: Mapping[str, Any]) -> dict[str, Any]:
    """What the page shows of one trajectory record."""
    metadata = record.get("metadata") or {}
    evaluation = metadata.get("eval") or {}
    outcome = record.get("outcome")
    correct = evaluation.get("correct")
    if correct is None:
        correct = outcome is not None and float(outcome) >= CORRECT_THRESHOLD
    advantages = metadata.get("turn_advantages") or metadata.get("advantages") or []
    messages = record.get("messages") or []
    turns = record.get("turns") or []
    if not turns:  # plain chat data: turns from the messages, without the env's verdicts
        for index, message in enumerate(messages):
            if message.get("role") == "assistant":
                after = messages[index + 1] if index + 1 < len(messages) else None
                turns.append({"kind": "", "valid": True, "assistant": message.get("content", ""),
                              "env_reply": (after or {}).get("content")})
    shown = []
    for index, turn in enumerate(turns):
        advantage = advantages[index] if index < len(advantages) else None
        shown.append({"kind": turn.get("kind", ""), "valid": bool(turn.get("valid", True)),
                      "reason": turn.get("reason", ""),
                      "forced": bool(turn.get("forced_final")),
                      "parts": split_turn(str(turn.get("assistant", ""))),
                      "reply": turn.get("env_reply"),
                      "ig": turn.get("ig_reward"), "outcome": turn.get("outcome_reward"),
                      "format": turn.get("format_reward"),
                      "reward": _sum_known(turn.get("outcome_reward"), turn.get("format_reward"),
                                           turn.get("ig_reward")),
                      "advantage": advantage if isinstance(advantage, int | float) else None})
    system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
    hops = evaluation.get("hops", metadata.get("hops"))
    return {"id": str(record.get("id", "")), "task": str(record.get("task_id", "")),
            "question": str(record.get("question") or _first_user(messages)),
            "answers": [str(a) for a in record.get("answers") or []],
            "prediction": evaluation.get("prediction"), "outcome": outcome,
            "correct": bool(correct), "hops": hops if isinstance(hops, int) else None,
            "type": evaluation.get("type"), "judge": evaluation.get("judge"),
            "errors": sum(not t["valid"] for t in shown), "turns": shown, "system": system,
            "sample": evaluation.get("sample")}


def _first_user(messages: Iterable[Mapping[str, Any]]) -> str:
    return next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")


def _sum_known(*values: Any) -> float | None:
    known = [float(v) for v in values if isinstance(v, int | float)]
    return sum(known) if known else None


def embedded_json(value: Any) -> str:
    """JSON that is safe inside a <script> block: no '<', '>' or '&' characters; a string
    UTF-8 cannot encode (a lone surrogate) makes it all-ASCII, so the page can be written."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, allow_nan=False, default=str)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_page(items: list[dict[str, Any]], title: str,
                skipped: list[str] | None = None) -> str:
    """The whole HTML page for the view items (and the reasons records were skipped)."""
    data = embedded_json({"title": title, "items": items, "skipped": skipped or []})
    safe_title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (_PAGE.replace("__TITLE__", safe_title).replace("__STYLE__", _STYLE)
            .replace("__SCRIPT__", _SCRIPT).replace("__DATA__", data))


def write_viewer(path: str | Path, output: str | Path, title: str | None = None,
                 skipped: list[str] | None = None) -> tuple[Path, int]:
    """Write the page for a trajectory JSONL; returns (its path, trajectories shown).

    Records that cannot be shown are skipped; "line N: why" for each is appended to
    `skipped` (and listed on the page). The page is written atomically.
    """
    records, reasons = read_records(path)
    items = []
    for record in _finite(records):
        problem = shape_problem(record)
        if not problem:
            try:
                items.append(view_item(record))
                continue
            except (AttributeError, TypeError, ValueError, KeyError) as e:  # a safety net
                problem = f"cannot be shown ({type(e).__name__}: {e})"
        reasons.append(f"record {record.get('id', '?')!s:.60}: {problem}")
    if skipped is not None:
        skipped.extend(reasons)
    if not items:
        raise ValueError(f"{path} has no trajectory the page can show ({len(reasons)} "
                         f"skipped{': ' + reasons[0] if reasons else ''})")
    output = Path(output)
    page = render_page(items, title or Path(path).name, reasons)
    with atomic_output(output) as temporary:
        temporary.write_text(page, encoding="utf-8", errors="replace")
    return output, len(items)


def _finite(value: Any) -> Any:
    """NaN / inf (which JSON cannot hold) as None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def main_args(args: Any) -> int:
    import sys

    skipped: list[str] = []
    try:
        output, count = write_viewer(args.file, args.output, skipped=skipped)
    except (OSError, ValueError) as e:
        print(f"venus-gym view: {e}", file=sys.stderr)
        return 2
    if skipped:
        print(f"venus-gym view: skipped {len(skipped)} record(s) that cannot be shown:\n  "
              + "\n  ".join(skipped[:20]) + ("\n  ..." if len(skipped) > 20 else ""),
              file=sys.stderr)
    print(f"wrote {output} ({count} trajectories); open it in a browser")
    return 0


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; \
style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title><style>__STYLE__</style></head>
<body>
<header><h1 id="title"></h1><details id="skipped" hidden><summary></summary><ul></ul></details>
<form id="filters">
<label>outcome <select id="f-outcome"><option value="">all</option>
<option value="correct">correct</option><option value="wrong">wrong</option></select></label>
<label>hops <select id="f-hops"><option value="">all</option></select></label>
<label>format <select id="f-format"><option value="">all</option>
<option value="errors">with format errors</option><option value="clean">no format errors</option>
</select></label>
<label>search <input id="f-q" type="search" placeholder="question, answer, text"></label>
<span id="count"></span></form></header>
<main><nav><ol id="list"></ol></nav><article id="detail"></article></main>
<script type="application/json" id="data">__DATA__</script>
<script>__SCRIPT__</script>
</body></html>
"""

_STYLE = """
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,sans-serif;color:#1d1d1f;
background:#f6f6f4}header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;
padding:.5rem 1rem;z-index:1}h1{font-size:1.1rem;margin:.2rem 0 .4rem}
form{display:flex;gap:1rem;flex-wrap:wrap;align-items:center}#count{color:#555;margin-left:auto}
main{display:grid;grid-template-columns:minmax(16rem,26rem) 1fr;gap:0;height:calc(100vh - 5.5rem)}
nav{overflow:auto;border-right:1px solid #ddd;background:#fff}
ol{list-style:none;margin:0;padding:0}li.traj{padding:.45rem .7rem;border-bottom:1px solid #eee;
cursor:pointer}li.traj:hover{background:#f0f4fa}li.traj.selected{background:#e2ecf8}
li.traj .q{display:block;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.badge{display:inline-block;font-size:.75rem;padding:0 .4rem;border-radius:.6rem;margin-right:.3rem;
background:#eee}.ok{background:#d4f0dc;color:#14532d}.bad{background:#fbdada;color:#7f1d1d}
.warn{background:#fdeccc;color:#7c4a03}article{overflow:auto;padding:1rem 1.5rem}
.meta{color:#444;margin:.2rem 0}.turn{background:#fff;border:1px solid #ddd;border-radius:6px;
margin:.8rem 0;padding:.6rem .8rem}.turn.malformed{border-color:#e05252;border-width:2px}
.turn h3{font-size:.9rem;margin:0 0 .4rem;display:flex;gap:.5rem;flex-wrap:wrap;align-items:center}
.part{white-space:pre-wrap;word-break:break-word;margin:.3rem 0;padding:.35rem .6rem;
border-left:4px solid #bbb;border-radius:3px}.think{background:#f3f0fa;border-color:#8b6fc9;
color:#3b2a63;font-style:italic}.call{background:#eaf3ff;border-color:#2f6fc0;
font-family:ui-monospace,monospace}.answer{background:#e7f6ec;border-color:#2e8b57;font-weight:600}
.text{background:#fafafa}.reply{background:#fff8e6;border-color:#d9a21b;
font-family:ui-monospace,monospace;font-size:.85em;max-height:18rem;overflow:auto}
.reason{color:#a11d1d;font-weight:600}.nums{color:#333;font-size:.8rem;font-weight:400}
.label{font-size:.7rem;text-transform:uppercase;letter-spacing:.04em;color:#666;display:block}
details{margin:.4rem 0}summary{cursor:pointer;color:#555}
"""

_SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const ITEMS = DATA.items;
const $ = (id) => document.getElementById(id);
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}
function num(x) { return (typeof x === "number") ? (Math.abs(x) >= 100 ? x.toFixed(1) : x.toFixed(3)) : null; }
function readHash() {
  const out = {};
  for (const pair of location.hash.replace(/^#/, "").split("&")) {
    if (!pair) continue;
    const at = pair.indexOf("=");
    try {
      const key = decodeURIComponent(at < 0 ? pair : pair.slice(0, at));
      out[key] = decodeURIComponent(at < 0 ? "" : pair.slice(at + 1));
    } catch (e) {
      continue;  // a hand-edited fragment that does not decode ("100%"): ignored
    }
  }
  return out;
}
let selected = null;
function state() {
  return {outcome: $("f-outcome").value, hops: $("f-hops").value, format: $("f-format").value,
          q: $("f-q").value.trim().toLowerCase()};
}
function writeHash() {
  const s = state();
  const parts = [];
  for (const key of ["outcome", "hops", "format", "q"]) if (s[key]) parts.push(key + "=" + encodeURIComponent(s[key]));
  if (selected !== null) parts.push("traj=" + encodeURIComponent(ITEMS[selected].id));
  history.replaceState(null, "", "#" + parts.join("&"));
}
function matches(item, s) {
  if (s.outcome === "correct" && !item.correct) return false;
  if (s.outcome === "wrong" && item.correct) return false;
  if (s.hops && String(item.hops) !== s.hops) return false;
  if (s.format === "errors" && item.errors === 0) return false;
  if (s.format === "clean" && item.errors > 0) return false;
  if (s.q) {
    const hay = [item.question, item.id, item.prediction || "", item.answers.join(" ")]
      .concat(item.turns.map((t) => t.parts.map((p) => p.text).join(" ") + " " + (t.reply || "")))
      .join(" ").toLowerCase();
    if (!hay.includes(s.q)) return false;
  }
  return true;
}
function renderList() {
  const s = state();
  const list = $("list");
  list.replaceChildren();
  let shown = 0, firstShown = null;
  ITEMS.forEach((item, index) => {
    if (!matches(item, s)) return;
    shown += 1;
    if (firstShown === null) firstShown = index;
    const li = el("li", "traj" + (index === selected ? " selected" : ""));
    li.dataset.index = String(index);
    li.append(el("span", "badge " + (item.correct ? "ok" : "bad"), item.correct ? "correct" : "wrong"));
    if (item.hops !== null) li.append(el("span", "badge", item.hops + (item.hops === 1 ? " hop" : " hops")));
    if (item.errors) li.append(el("span", "badge warn", item.errors + " format error" + (item.errors > 1 ? "s" : "")));
    li.append(el("span", "badge", item.turns.length + " turns"));
    li.append(el("span", "q", item.question || item.id));
    li.addEventListener("click", () => { selected = index; renderList(); renderDetail(); writeHash(); });
    list.append(li);
  });
  const count = $("count");
  count.textContent = shown + " of " + ITEMS.length + " trajectories";
  count.dataset.shown = String(shown);
  if (selected === null || !matches(ITEMS[selected], s)) {
    selected = firstShown;
    if (selected !== null) list.querySelector('li[data-index="' + selected + '"]').classList.add("selected");
    renderDetail();
  }
}
function renderDetail() {
  const box = $("detail");
  box.replaceChildren();
  if (selected === null) { box.append(el("p", "meta", "No trajectory matches the filters.")); return; }
  const item = ITEMS[selected];
  box.append(el("h2", null, item.question || item.id));
  const facts = [["id", item.id], ["gold", item.answers.join(" | ")], ["prediction", item.prediction],
                 ["outcome", num(item.outcome)], ["type", item.type], ["sample", item.sample]];
  for (const [label, value] of facts) {
    if (value === null || value === undefined || value === "") continue;
    const p = el("p", "meta"); p.append(el("b", null, label + ": "), document.createTextNode(String(value)));
    box.append(p);
  }
  if (item.judge) {
    const p = el("p", "meta"); p.append(el("b", null, "judge: "),
      document.createTextNode(item.judge.error ? item.judge.error : (item.judge.correct ? "correct" : "not correct") + (item.judge.detail ? " (" + item.judge.detail + ")" : "")));
    box.append(p);
  }
  if (item.system) {
    const d = el("details"); d.append(el("summary", null, "system prompt"), el("div", "part text", item.system));
    box.append(d);
  }
  item.turns.forEach((turn, index) => {
    const card = el("section", "turn" + (turn.valid ? "" : " malformed"));
    const head = el("h3", null);
    head.append(el("span", null, "Turn " + (index + 1)));
    if (turn.kind) head.append(el("span", "badge " + (turn.valid ? "" : "bad"), turn.kind));
    if (turn.forced) head.append(el("span", "badge warn", "forced final"));
    const nums = [["IG", turn.ig], ["outcome", turn.outcome], ["format", turn.format], ["reward", turn.reward], ["advantage", turn.advantage]]
      .filter(([, v]) => typeof v === "number").map(([k, v]) => k + " " + num(v)).join(" · ");
    if (nums) head.append(el("span", "nums", nums));
    card.append(head);
    if (!turn.valid) card.append(el("p", "reason", "malformed: " + (turn.reason || "no reason given")));
    for (const part of turn.parts) {
      const box2 = el("div", "part " + part.kind);
      box2.append(el("span", "label", {think: "reasoning", call: "tool call", answer: "answer", text: "text"}[part.kind]));
      box2.append(document.createTextNode(part.text));
      card.append(box2);
    }
    if (turn.reply !== null && turn.reply !== undefined) {
      const reply = el("div", "part reply");
      reply.append(el("span", "label", "tool response"), document.createTextNode(turn.reply));
      card.append(reply);
    }
    box.append(card);
  });
}
function init() {
  $("title").textContent = DATA.title + " (" + ITEMS.length + " trajectories)";
  if (DATA.skipped.length) {
    const box = $("skipped");
    box.hidden = false;
    box.querySelector("summary").textContent = "skipped " + DATA.skipped.length +
      " record" + (DATA.skipped.length > 1 ? "s" : "") + " that cannot be shown";
    for (const reason of DATA.skipped.slice(0, 100)) box.querySelector("ul").append(el("li", null, reason));
  }
  const hops = [...new Set(ITEMS.map((i) => i.hops).filter((h) => h !== null))].sort((a, b) => a - b);
  for (const h of hops) { const o = el("option", null, h); o.value = String(h); $("f-hops").append(o); }
  const wanted = readHash();
  if (wanted.outcome) $("f-outcome").value = wanted.outcome;
  if (wanted.hops) $("f-hops").value = wanted.hops;
  if (wanted.format) $("f-format").value = wanted.format;
  if (wanted.q) $("f-q").value = wanted.q;
  if (wanted.traj) { const at = ITEMS.findIndex((i) => i.id === wanted.traj); if (at >= 0) selected = at; }
  for (const id of ["f-outcome", "f-hops", "f-format"]) $(id).addEventListener("change", () => { renderList(); writeHash(); });
  $("f-q").addEventListener("input", () => { renderList(); writeHash(); });
  renderList();
  renderDetail();
  document.body.dataset.ready = "1";
}
init();
"""


__all__ = ["embedded_json", "read_records", "render_page", "shape_problem", "split_turn",
           "view_item", "write_viewer"]

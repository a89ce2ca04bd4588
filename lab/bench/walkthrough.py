"""`sapo bench walkthrough`: a contributor's first hour, scripted in the real window under Xvfb.

What a newcomer does, in order, each step timed and captured (bench/screenshots/walkthrough_<step>.png,
`import -window root` from ImageMagick on a private Xvfb, as tests/app/screenshot_main.py does):

  1. first start on a fresh data dir: the engine process started as `sapo gui` starts it
     (app.main.start_engine + wait_for_start, `sapo run --headless --control --supervised --paused`;
     its first run trains the model `sapo doctor` picks, SmolLM2-135M-Instruct on a laptop CPU), the
     real MainWindow linked through EngineBridge;
  2. Join (a click on the header's button) and the time until the header first shows the engine's
     WorkProgress ("Loading …"); goal <= 2 s;
  3. the first round: loading, the held-out baseline, generating, updating, and the round completed on
     the dashboard ("Your model" card on top);
  4. a peer: a second engine on this machine training the seed model (`sapo run --headless --model
     seed`, its own data dir), linked over 127.0.0.1; the Peers and Shared rollouts tabs;
  5. Try it: a question asked and its answer;
  6. Leave, then a model switch on the Machine tab (the seed model's row selected, the switch button
     clicked): the header's model stat, the seed's own round 1 after a Join, Leave, and the switch back,
     where the first model's round count and totals should come back (rounds are per model);
  7. a restart: the window closed (no tray under Xvfb: the engine stops) and this app process ends; a
     new app process starts again on the same data dir and checks that the round count, the model and
     the totals came back.

Both engines stay on 127.0.0.1: no mDNS (`--no-mdns`), a private swarm name, a listener on 127.0.0.1,
no bootstrap. The Qt half runs in child processes (`python -m lab.bench.walkthrough_steps`, the Qt
driver in lab/bench/walkthrough_window.py): Qt's platform is fixed per process, the children get the
Xvfb display, and this parent stays Qt-free. The first child does steps 1-7 up to the window closed and
hands the second (the restart, a new QApplication) what it must find (HANDOFF); this parent merges
both children's steps and notes. Writes bench/walkthrough.{json,md}.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.control.launcher import stop_process
from engine.paths import REPO_ROOT
from lab import BENCH_DIR
from lab.bench import save_results
from lab.display import start_xvfb

DESCRIPTION = "a contributor's first hour in the real window under Xvfb: steps, timings, screenshots"
LONG = True  # ~10-20 minutes on 2 busy cores: a real model loads and trains a few rounds
STEM = "walkthrough"
JOIN_GOAL_S = 2.0  # Join -> the header shows what the engine is doing
SCREEN = (1280, 820)  # the window's own default size, as the committed main-window screenshots
PIDS_FILE = "engine_pids.txt"  # the children name every engine they start here; the parent kills leftovers
HANDOFF = "handoff.json"  # the first app process -> the restart: data dir, engine args, the values to find
CHILD = "lab.bench.walkthrough_steps"
PHASES = ("first", "restart")  # one app process each, in order, under the same Xvfb
RESTART_MIN_S = 300.0  # the restart's own budget when the first app process used up the whole one


# --- the parent: Xvfb, the two app processes, the results ----------------------------------------------

def _kill_leftovers(work: Path) -> list[int]:
    """Every engine an app process started and left running (it crashed, or timed out): its whole process
    group (the supervisor and its engine child), SIGTERM then SIGKILL."""
    try:
        pids = [int(line) for line in (work / PIDS_FILE).read_text().split() if line.strip().isdigit()]
    except OSError:
        return []
    killed = []
    for pid in pids:
        for sig, pause in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            killed.append(pid)
            deadline = time.monotonic() + pause
            while time.monotonic() < deadline:
                try:
                    os.killpg(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
    return sorted(set(killed))


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _app_process(phase: str, work: Path, shots: Path, rounds: int, budget_s: float, t0: float,
                 env: dict[str, str]) -> tuple[dict[str, Any] | None, int | None]:
    """One app process of the walk-through (a new Python, a new QApplication) -> (its WORK/<phase>.json,
    its exit status; None when it ran past its budget and was killed)."""
    launched = time.monotonic()  # the same clock in the child: its `at_s` and the restart's seconds count from here
    cmd = [sys.executable, "-m", CHILD, phase, str(work), str(shots), str(rounds), str(budget_s), repr(t0),
           repr(launched)]
    try:
        rc: int | None = subprocess.run(cmd, cwd=REPO_ROOT, env=env, timeout=t0 + budget_s - launched + 600,
                                        check=False).returncode
    except subprocess.TimeoutExpired:
        rc = None
    try:
        return json.loads((work / f"{phase}.json").read_text()), rc
    except (OSError, json.JSONDecodeError):
        return None, rc


def _both(work: Path, shots: Path, rounds: int, timeout_s: float) -> dict[str, Any]:
    """The first app process, then (on what it handed over) the restart in a new one, under one Xvfb."""
    t0 = time.monotonic()
    xvfb, display = start_xvfb(*SCREEN)
    env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"}
    ran: dict[str, tuple[dict[str, Any] | None, int | None]] = {}
    notes: list[str] = []
    try:
        for phase in PHASES:
            if phase == "restart" and not (work / HANDOFF).is_file():
                notes.append("the restart did not run: the first app process handed over nothing")
                break
            budget = timeout_s if phase == "first" else max(timeout_s, time.monotonic() - t0 + RESTART_MIN_S)
            ran[phase] = _app_process(phase, work, shots, rounds, budget, t0, env)
            left = _kill_leftovers(work)  # the restart must start its own engine on the data dir
            (work / PIDS_FILE).unlink(missing_ok=True)
            if left:
                notes.append(f"engines still running after the {phase} app process were killed: pids {left}")
    finally:
        stop_process(xvfb, 10)
    first, first_rc = ran.get("first", (None, None))
    if first is None:
        raise RuntimeError(f"the walk-through's first app process (exit {first_rc}) wrote no result; "
                           f"its files: {work}")
    result = _merge(ran, notes)
    result["total_s"] = round(time.monotonic() - t0, 1)
    return result


def _merge(ran: dict[str, tuple[dict[str, Any] | None, int | None]], notes: list[str]) -> dict[str, Any]:
    """Both app processes' steps and notes, in order, in the one result (the keys of a one-process walk)."""
    result: dict[str, Any] = {"join_goal_s": JOIN_GOAL_S, "model": "", "join_to_first_progress_s": None}
    steps: list[dict[str, Any]] = []
    merged_notes: list[str] = []
    failed = len(ran) < len(PHASES)
    processes = []
    for phase, (child, rc) in ran.items():
        processes.append({"phase": phase, "exit": rc, "pid": (child or {}).get("pid"),
                          "qt_ready_s": (child or {}).get("qt_ready_s")})
        if child is None:
            merged_notes.append(f"the {phase} app process (exit {rc}) wrote no result")
            failed = True
            continue
        result.setdefault("load_average_start", child.get("load_average_start"))
        result.update(child.get("out") or {})
        steps += child.get("steps", [])
        merged_notes += child.get("notes", [])
        failed = failed or rc != 0 or bool(child.get("failed"))
    result.update(steps=steps, notes=merged_notes + notes, failed=failed, app_processes=processes)
    return result


def run(out_dir: Path = BENCH_DIR, rounds: int = 2, timeout_s: float = 1500.0, keep: bool = False) -> dict[str, Any]:
    """`rounds`: SmolLM2 rounds trained before Leave and the switch (a few; each takes 30-90 s on a busy CPU);
    `timeout_s`: the whole walk-through's budget (a step that runs out of it is noted, the rest still
    runs and the engines are stopped; the restart gets RESTART_MIN_S at least); `keep`: keep the
    temporary data dirs (kept anyway on a failure)."""
    out_dir = Path(out_dir)
    shots = out_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sapo-walk-"))
    failed = True
    try:
        result = _both(work, shots, rounds, timeout_s)
        failed = bool(result["failed"])
    finally:
        left = _kill_leftovers(work)
        if keep or failed:
            print(f"walkthrough: data dirs and engine logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if left:
        result["notes"].append(f"engines still running at the end were killed: pids {left}")
    for step in result["steps"]:
        if step.get("screenshot"):
            step["screenshot"] = _relative(Path(step["screenshot"]))
    result["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["load_average_end"] = round(os.getloadavg()[0], 2)
    result["cores"] = os.cpu_count()
    return save_results(out_dir, STEM, result, table, lambda _result, _path: None)


def table(result: dict[str, Any]) -> str:
    join = result.get("join_to_first_progress_s")
    verdict = ("n/a" if join is None else f"{join:.2f} s ({'meets' if join <= result['join_goal_s'] else 'MISSES'} "
               f"the {result['join_goal_s']:g} s goal)")
    model = result.get("model_name") or result["model"]
    lines = [(f"A contributor's first hour, scripted in the real window under Xvfb ({model}; "
              f"{result.get('measured_at', '?')}; {result.get('cores', '?')} cores, load average "
              f"{result.get('load_average_start', '?')} at the start)"),
             "",
             f"Join -> first progress in the header: {verdict}.",
             ""]
    if result.get("first_round_phases_s"):
        lines += [("How long the header showed each phase of the first round: " + ", ".join(
            f"{k} {v:g} s" for k, v in result["first_round_phases_s"].items()) + "."), ""]
    lines += [("Seconds: each step's own wait; for the first round's phases (loading to round_done) and the "
               "seed's first round (switched_round), since Join; for a switch, from the click on the switch "
               "button until the header's model stat names the model; for the restart, since the new app "
               "process was launched. At: seconds since the walk-through started (both app processes)."),
              "",
              "| step | seconds | at (s) | header / what it shows | screenshot |",
              "|---|---|---|---|---|"]
    for s in result["steps"]:
        seconds = "timed out" if s.get("seconds") is None else f"{s['seconds']:.1f}"
        shows = str(s.get("shows", "")).replace("|", "/")
        shot = f"[{Path(s['screenshot']).name}]({Path(s['screenshot']).relative_to('bench')})" \
            if str(s.get("screenshot", "")).startswith("bench/") else str(s.get("screenshot") or "")
        lines.append(f"| {s['name']} | {seconds} | {s.get('at_s', 0):.0f} | {shows} | {shot} |")
    lines += _switch_lines(result.get("switch") or {}) + _restart_lines(result.get("restart") or {})
    if result.get("notes"):
        lines += ["", "Notes:", *[f"- {n}" for n in result["notes"]]]
    return "\n".join(lines)


def _seconds(value: Any) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _switch_lines(switch: dict[str, Any]) -> list[str]:
    to_seed = switch.get("to_seed")
    if not to_seed:
        return []
    lines = ["", (f"Switch to {to_seed.get('model')} (Machine tab, its row selected, the switch button clicked): "
                  f"the tab's line beside the button after {_seconds(to_seed.get('tab_line_s'))}, the header's "
                  f"state line after {_seconds(to_seed.get('header_line_s'))}, its model stat after "
                  f"{_seconds(to_seed.get('header_model_s'))}; lines shown: "
                  + " -> ".join(f"'{text}' ({at:g} s)" for at, text in to_seed.get("tab_lines", [])) + ".")]
    seed = switch.get("seed_round") or {}
    if seed:
        rounds_seen = seed.get("header_rounds_seen") or []
        seen = " -> ".join(f"{shown} ({at:g} s)" for at, shown in rounds_seen)
        late = rounds_seen and rounds_seen[0][1] != "1"  # a seed round takes about a second here
        lines.append(f"The seed's first round on the dashboard {_seconds(seed.get('seconds'))} after Join "
                     f"(the header's round from then on, seconds since Join: {seen or '?'}"
                     + ("; the window showed a later round first" if late else "") + ").")
    back = switch.get("back") or {}
    if back:
        verdict = (f"came back after {_seconds(back.get('came_back_s'))}" if back.get("came_back")
                   else "DID NOT come back")
        lines.append(f"Switch back to {back.get('model')}: the header's model stat after "
                     f"{_seconds(back.get('header_model_s'))}; its round count and totals {verdict} "
                     f"(the window showed {back.get('values')}).")
    return lines


def _restart_lines(restart: dict[str, Any]) -> list[str]:
    if not restart:
        return []
    came_back = "came back" if restart.get("same") else "DID NOT come back"
    process = (f"a new app process (pid {restart.get('app_pid')}; the first was pid {restart.get('first_app_pid')}, "
               "ended with its window)" if restart.get("new_process") else "the same app process")
    at_close = "" if restart.get("same") or not restart.get("at_close") else (
        " The window showed the same when it closed" if restart.get("same_as_at_close")
        else f" When it closed the window showed {restart.get('at_close')}")
    return ["", (f"The restart was {process}. After it the round count, model and totals {came_back}: "
                 f"before (at Leave, before the switch) {restart.get('before')}, after {restart.get('after')}."
                 + (f"{at_close}." if at_close else ""))]

"""The walk-through's app processes: `python -m lab.bench.walkthrough_steps PHASE WORK SHOTS ROUNDS TIMEOUT_S
T0 LAUNCHED`, started by lab/bench/walkthrough.py under its Xvfb (see its docstring for the whole walk).

PHASE "first": a fresh data dir, Join, the first SmolLM2 round, a peer, Try it, Leave, a switch to the seed
model and its first round, Leave, the switch back, and the window closed; it hands the restart what it must
find (lab.bench.walkthrough.HANDOFF in WORK). PHASE "restart": a new app process on the same data dir, as
`sapo gui` started again. Each writes its steps and notes to WORK/<PHASE>.json.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from app.views.machine import short_model_name
from engine.control.launcher import start_engine
from lab.bench.walkthrough import HANDOFF, JOIN_GOAL_S
from lab.bench.walkthrough_window import Walk

SEED = "seed"  # the 1.9M-parameter model that trains fast: the one a contributor switches to here
PHASE_NAMES = {"loading_model": "loading", "evaluating": "baseline_eval", "generating": "generating",
               "updating": "updating"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _header_shows_work(w: Walk) -> bool:
    """The header's detail line is the engine's current phase (WorkProgress), not a leftover."""
    win = w.window
    node = win.model.node
    return node.work is not None and bool(win.state_detail.text()) and win.state_detail.text() == node.activity()


# --- the first app process -----------------------------------------------------------------------------

def first_start(w: Walk, data_dir: Path, engine_args: tuple[str, ...]) -> dict[str, Any]:
    served, shown = w.open_window(data_dir, engine_args, dialog_shot="starting")
    win = w.window
    node = win.model.node
    w.step("first_start", shown, w.shot("first_start"), engine_served_s=round(served, 2),
           subtitle=win.subtitle.text(), model_line=win.header.model_line.text(),
           your_model=win.dashboard.your_model.text.text())
    return {"model": node.model, "model_name": node.model_name, "tray": win.tray is not None}


def join(w: Walk, out: dict[str, Any]) -> tuple[float, float | None]:
    """Join (a click on the header's button) -> the header's first progress; (the click's time, its seconds)."""
    win = w.window
    before_label, before_detail = win.state_label.text(), win.state_detail.text()
    first: dict[str, float] = {}

    def progress_shown() -> bool:
        if "label" not in first and (win.state_label.text(), win.state_detail.text()) != (before_label, before_detail):
            first["label"] = time.monotonic() - clicked
        return _header_shows_work(w)
    clicked = w.click(win.join_button)
    seconds = w.wait(progress_shown, 120, "the header's first progress after Join")
    out["join_to_first_progress_s"] = None if seconds is None else round(seconds, 3)
    out["join_to_header_change_s"] = round(first["label"], 3) if "label" in first else None
    w.step("join", seconds, w.shot("join"), goal_s=JOIN_GOAL_S, work_phase=getattr(win.model.node.work, "phase", None))
    return clicked, seconds


def first_round(w: Walk, clicked: float, seconds: float | None, out: dict[str, Any]) -> None:
    """Each phase the first time the header shows it, then the round done on the dashboard."""
    win = w.window
    node = win.model.node
    seen: dict[str, float] = {node.work.phase: seconds} if seconds is not None and node.work is not None else {}

    def phases() -> None:
        phase = getattr(node.work, "phase", None)
        if phase in PHASE_NAMES and phase not in seen and win.state_detail.text() == node.activity():
            seen[phase] = time.monotonic() - clicked
            w.step(PHASE_NAMES[phase], seen[phase], w.shot(PHASE_NAMES[phase]), since="join")
    got = w.wait(lambda: win.model.dashboard.rounds >= 1, 1200, "the first round", each=phases)
    for phase, name in PHASE_NAMES.items():
        if phase not in seen:
            w.note(f"the header never showed the {name} phase before round 1 ended")
    w.pump(1.0)  # the round's batch and the card's refresh
    marks = [("nothing_yet", 0.0), *sorted(seen.items(), key=lambda item: item[1])]
    if got is not None:
        marks.append(("round_done", time.monotonic() - clicked))
    out["first_round_phases_s"] = {a: round(tb - ta, 1) for (a, ta), (_b, tb) in itertools.pairwise(marks)}
    w.step("round_done", None if got is None else time.monotonic() - clicked, w.shot("round_done"),
           since="join", your_model=win.dashboard.your_model.text.text(),
           your_model_detail=win.dashboard.your_model.detail.text(),
           cards={k: v.text() for k, v in win.dashboard.cards.items()})


def peer(w: Walk, swarm: str, port: int) -> None:
    """A second engine on this machine training the seed model, linked over 127.0.0.1."""
    win = w.window
    peer_dir = w.work / "peer"
    peer_cmd = [sys.executable, "-m", "engine", "run", "--headless", "--model", SEED, "--seed", "7",
                "--data-dir", str(peer_dir), "--no-mdns", "--swarm", swarm, "--listen", "127.0.0.1:0",
                "--peer", f"ws://127.0.0.1:{port}"]
    start = time.monotonic()
    w.track(start_engine(peer_dir, command=peer_cmd))  # idle priority, like the app's engine
    got = w.wait(lambda: win.model.node.peers >= 1, 180, "the peer to show in the header")
    w.step("peer", got, w.shot("peers", win.peers))
    got = w.wait(lambda: len(win.model.feed.rows) >= 1, w.remaining(240), "a peer's rollouts in the feed")
    w.step("shared_rollouts", None if got is None else time.monotonic() - start,
           w.shot("shared_rollouts", win.rollouts), feed_rows=len(win.model.feed.rows))


def try_it(w: Walk) -> None:
    win = w.window
    view = win.try_it
    win.tabs.setCurrentWidget(view)
    w.pump(0.5)
    if not view.ask_button.isEnabled():
        w.wait(lambda: view.ask_button.isEnabled(), 30, "the Try it button")
    start = w.click(view.ask_button)
    w.pump(3.0)
    w.step("try_it_waiting", time.monotonic() - start, w.shot("try_it_waiting", view), shows=view.status.text())
    got = w.wait(lambda: view.asked_at is None, 900, "Try it's answer")
    w.step("try_it", None if got is None else time.monotonic() - start, w.shot("try_it", view),
           shows=view.status.text(), question=view.question.text(), yours=view.yours.verdict.text(),
           yours_answer=view.yours.answer.text(), start_model=view.start.verdict.text())


def leave(w: Walk, name: str) -> dict[str, str]:
    """Leave (the header's button, from the dashboard) -> what the window shows once the node stopped."""
    win = w.window
    node = win.model.node
    win.tabs.setCurrentWidget(win.dashboard)
    w.pump(0.5)
    w.click(win.join_button)
    got = w.wait(lambda: node.connected and node.state == "stopped", 300, "the node to leave")
    w.pump(0.5)
    values = w.values()
    w.step(name, got, w.shot(name), values=values)
    return values


def switch_model(w: Walk, model_id: str, stat: str) -> dict[str, Any]:
    """Machine tab: select `model_id`'s row, click the switch button. Seconds from the click until the tab's
    line, the header's state line, and the header's model stat (`stat`) show the switch; the lines seen."""
    win = w.window
    view, node = win.machine, win.model.node
    win.tabs.setCurrentWidget(view)
    w.pump(0.6)
    if view.table.rowCount() == 0:  # the machine report arrives after the link; a contributor clicks Check again
        w.click(view.refresh_button)
        w.wait(lambda: view.table.rowCount() > 0, 180, "the Machine tab's model table")
    row = short_model_name(model_id)
    if not w.select_row(view.table, row):
        w.note(f"the Machine tab's table has no row {row!r} to select")
        return {"model": model_id, "switched": False}
    if not view.switch_button.isEnabled():
        w.note(f"the switch button was off with the node {node.state} ({view.switch_button.toolTip()!r})")
        w.wait(view.switch_button.isEnabled, 30, "the switch button")
    header_before, line_before = (win.state_label.text(), win.state_detail.text()), view.progress_label.text()
    marks: dict[str, float] = {}
    lines: list[list[Any]] = []

    def watch() -> None:
        now, line = round(time.monotonic() - clicked, 2), view.progress_label.text()
        if line and (not lines or lines[-1][1] != line):
            lines.append([now, line])
        if line and line != line_before:
            marks.setdefault("tab_line", now)
        if (win.state_label.text(), win.state_detail.text()) != header_before:
            marks.setdefault("header_line", now)
        if short_model_name(node.model) == row and win.stats["model"].text() == stat:
            marks.setdefault("header_model", now)

    def done() -> bool:
        watch()
        failed = view.progress_label.property("role") == "error"
        return failed or ("header_model" in marks and view.switch_button.isEnabled())
    clicked = w.click(view.switch_button)
    w.wait(done, 300, f"the header's model stat to show {stat} after the switch")
    w.pump(0.5)
    watch()
    if view.progress_label.property("role") == "error":
        w.note(f"the switch to {row} failed: {view.progress_label.text()}")
    quiet_header = "header_line" not in marks and "header_model" in marks
    if quiet_header and not any("showed nothing of the switch" in n for n in w.notes):  # said once is enough
        w.note(f"switching to {row}, the header's state line showed nothing of the switch (it stayed "
               f"'{' · '.join(t for t in header_before if t)}'); only the Machine tab's line beside the button "
               f"did ({' -> '.join(repr(t) for _, t in lines)}), then the header's model stat changed")
    return {"model": model_id, "switched": "header_model" in marks, "clicked_at_s": round(clicked - w.t0, 2),
            "tab_line_s": marks.get("tab_line"),
            "header_line_s": marks.get("header_line"), "header_model_s": marks.get("header_model"),
            "tab_lines": lines, "values": w.values()}


def seed_round(w: Walk) -> dict[str, Any]:
    """Join on the seed model and its first round on the dashboard (rounds are numbered per model)."""
    win = w.window
    node, dash = win.model.node, win.model.dashboard
    win.tabs.setCurrentWidget(win.dashboard)
    w.pump(0.5)
    rounds_seen: list[list[Any]] = []  # [seconds since Join, the header's round] while it shows the seed's

    def watch() -> bool:
        shown = win.stats["round"].text()
        if node.round_model == SEED and (not rounds_seen or rounds_seen[-1][1] != shown):
            rounds_seen.append([round(time.monotonic() - clicked, 2), shown])
        return dash.model == SEED and dash.rounds >= 1 and node.round_model == SEED
    clicked = w.click(win.join_button)
    progress = w.wait(lambda: _header_shows_work(w), 120, "the header's first progress after Join on the seed")
    got = w.wait(watch, 900, "the seed model's first round on the dashboard")
    seconds = None if got is None else time.monotonic() - clicked
    w.pump(1.0)  # the card's refresh after the seed's history reload
    watch()
    values = w.values()
    w.step("switched_round", seconds, w.shot("switched_round"), since="join", values=values, round=node.round,
           first_progress_s=None if progress is None else round(progress, 2), header_rounds_seen=rounds_seen,
           your_model=win.dashboard.your_model.text.text())
    # Numbered per model: the seed's round count on the dashboard is its last round number (from its own 1).
    if got is not None and values["round"] != values["rounds"]:
        w.note(f"on the seed's first rounds the header says round {values['round']} and the dashboard "
               f"{values['rounds']} rounds: the seed's rounds are not numbered from its own round 1")
    return {"seconds": None if seconds is None else round(seconds, 2), "values": values, "round": node.round,
            "header_rounds_seen": rounds_seen}


def switch_back(w: Walk, model: str, before: dict[str, str]) -> dict[str, Any]:
    """Back to the first model: its round count and totals should come back (rounds are per model)."""
    back = switch_model(w, model, before["model"])
    if not back["switched"]:
        w.step("switched_back", None, w.shot("switched_back", w.window.machine), **back)
        return back
    win = w.window
    win.tabs.setCurrentWidget(win.dashboard)
    came = w.wait(lambda: {k: v for k, v in w.values().items() if k != "model"}
                  == {k: v for k, v in before.items() if k != "model"}, 30, "", quiet=True)
    back.update(came_back=came is not None,
                came_back_s=None if came is None else round(w.elapsed() - back["clicked_at_s"], 2))
    w.pump(0.5)
    back.update(values=w.values(), your_model=win.dashboard.your_model.text.text())
    w.step("switched_back", back["header_model_s"], w.shot("switched_back"), **back)
    if came is None:
        w.note(f"after the switch back to {before['model']} the window shows {back['values']} and "
               f"'{back['your_model']}' (the header's model stat changed after {back['header_model_s']:.1f} s); "
               f"before the switch it showed {before}: rounds are per model, so {before['model']}'s round count "
               "and totals should have come back (waited 30 s)")
    return back


def first_hour(w: Walk, rounds: int, out: dict[str, Any]) -> None:
    data_dir = w.work / "data"
    port = _free_port()
    swarm = f"walkthrough-{uuid.uuid4().hex[:8]}"  # never meets a node of the LAN, even with mDNS on
    engine_args = ("--paused", "--no-mdns", "--swarm", swarm, "--listen", f"127.0.0.1:{port}")  # as `sapo gui`
    w.say(f"fresh data dir {data_dir}; engine args {' '.join(engine_args)}")
    out["engine_args"] = list(engine_args)
    out.update(first_start(w, data_dir, engine_args))
    clicked, seconds = join(w, out)
    first_round(w, clicked, seconds, out)
    peer(w, swarm, port)
    try_it(w)
    w.wait(lambda: w.window.model.dashboard.rounds >= rounds, 900, f"{rounds} rounds")
    before = leave(w, "left")
    out["rounds_trained"] = w.window.model.node.round
    handoff = {"data_dir": str(data_dir), "engine_args": list(engine_args), "before": before,
               "app_pid": os.getpid(), "model": out["model"]}
    (w.work / HANDOFF).write_text(json.dumps(handoff))  # now: a failure later still leaves a restart to check
    switch: dict[str, Any] = {"to_seed": switch_model(w, SEED, SEED)}
    out["switch"] = switch
    w.step("switch", switch["to_seed"]["header_model_s"], w.shot("switch", w.window.machine), **switch["to_seed"])
    if switch["to_seed"]["switched"]:
        switch["seed_round"] = seed_round(w)
        leave(w, "left_seed")
        switch["back"] = switch_back(w, out["model"], before)
    handoff["at_close"] = w.values()
    closed = w.close_window()
    w.step("closed", closed, "", shows=f"window closed, engine exited; this app process (pid {os.getpid()}) ends"
           if closed is not None else "the engine did not exit by itself: stopped")
    (w.work / HANDOFF).write_text(json.dumps(handoff))


# --- the second app process: the restart ---------------------------------------------------------------

def restart(w: Walk, handoff: dict[str, Any], launched: float, out: dict[str, Any]) -> None:
    """The window opened again on the same data dir, as `sapo gui` is started again; the round count, the
    model and the totals must be those the first process showed at Leave (before the switch and back)."""
    before = handoff["before"]
    served, shown = w.open_window(Path(handoff["data_dir"]), tuple(handoff["engine_args"]))
    win = w.window
    at_close = handoff.get("at_close")

    def restored() -> bool:  # what should come back, or at least what the window showed when it closed
        return win.model.dashboard.rounds >= 1 and w.values() in (before, at_close)
    got = w.wait(restored, 60, "the round count, model and totals after the restart")
    seconds = None if got is None else time.monotonic() - launched
    if got is not None and w.values() != before:
        w.wait(lambda: w.values() == before, 15, "", quiet=True)  # a last reload might still bring them
    w.pump(1.0)
    after = w.values()
    w.step("restart", seconds, w.shot("restart"), since="the new app process's launch",
           engine_served_s=round(served, 2), window_connected_s=round(shown, 2), app_pid=os.getpid(),
           first_app_pid=handoff["app_pid"], values=after, your_model=win.dashboard.your_model.text.text())
    out["restart"] = {"before": before, "after": after, "same": before == after, "new_process": True,
                      "first_app_pid": handoff["app_pid"], "app_pid": os.getpid(), "at_close": at_close,
                      "same_as_at_close": after == at_close}
    if before != after:
        w.note(f"after the restart the window shows {after}, at Leave before the switch it showed {before}"
               + (" (the same as when the window closed, after the switch back)" if after == at_close else ""))


def child_main(argv: list[str]) -> int:
    phase, work, shots, rounds = argv[0], Path(argv[1]), Path(argv[2]), int(argv[3])
    timeout_s, t0, launched = (float(a) for a in argv[4:7])
    w = Walk(work, shots, t0, timeout_s)
    result: dict[str, Any] = {"phase": phase, "pid": os.getpid(), "load_average_start": round(os.getloadavg()[0], 2),
                              "qt_ready_s": round(time.monotonic() - launched, 2)}
    w.say(f"{phase}: app process {os.getpid()}, Xvfb display {os.environ.get('DISPLAY')}; "
          f"load average {os.getloadavg()[0]:.2f}")
    out: dict[str, Any] = {}
    failed = False
    try:
        if phase == "first":
            first_hour(w, rounds, out)
        else:
            restart(w, json.loads((work / HANDOFF).read_text()), launched, out)
    except Exception as exc:  # noqa: BLE001 - the result says what failed; the engines are stopped below
        failed = True
        traceback.print_exc()
        w.note(f"the walk-through ({phase} app process) failed: {type(exc).__name__}: {exc}")
        w.steps.append({"name": f"failed_{phase}", "seconds": None, "at_s": round(w.elapsed(), 1),
                        "screenshot": w.shot(f"failed_{phase}"), "shows": w.header()})
    finally:
        w.stop_all()
    result.update(out=out, steps=w.steps, notes=w.notes, failed=failed)
    (work / f"{phase}.json").write_text(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))

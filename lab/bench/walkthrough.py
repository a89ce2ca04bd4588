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
  6. a restart: Leave, close the window (no tray under Xvfb: the engine stops), start again on the same
     data dir and check that the round count, the model and the totals came back.

Both engines stay on 127.0.0.1: no mDNS (`--no-mdns`), a private swarm name, a listener on 127.0.0.1,
no bootstrap. The Qt half runs in a child process (`python -m lab.bench.walkthrough`): Qt's platform is
fixed per process, and the child gets the Xvfb display. Writes bench/walkthrough.{json,md}.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.paths import REPO_ROOT
from lab import BENCH_DIR
from lab.bench import save_results
from lab.display import start_xvfb

DESCRIPTION = "a contributor's first hour in the real window under Xvfb: steps, timings, screenshots"
LONG = True  # ~10-20 minutes on 2 busy cores: a real model loads and trains a few rounds
STEM = "walkthrough"
JOIN_GOAL_S = 2.0  # Join -> the header shows what the engine is doing
SCREEN = (1280, 820)  # the window's own default size, as the committed main-window screenshots
PIDS_FILE = "engine_pids.txt"  # the child names every engine it starts here; the parent kills leftovers


# --- the parent: Xvfb, the child, the results ----------------------------------------------------------

def _kill_leftovers(work: Path) -> list[int]:
    """Every engine the child started and left running (it crashed, or timed out): its whole process
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


def run(out_dir: Path = BENCH_DIR, rounds: int = 2, timeout_s: float = 1500.0, keep: bool = False) -> dict[str, Any]:
    """`rounds`: SmolLM2 rounds trained before the restart (a few; each takes 30-90 s on a busy CPU);
    `timeout_s`: the whole walk-through's budget (a step that runs out of it is noted, the rest still
    runs and the engines are stopped); `keep`: keep the temporary data dirs (kept anyway on a failure)."""
    out_dir = Path(out_dir)
    shots = out_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sapo-walk-"))
    xvfb: subprocess.Popen[bytes] | None = None
    failed = True
    try:
        xvfb, display = start_xvfb(*SCREEN)
        env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"}
        child = subprocess.run([sys.executable, "-m", "lab.bench.walkthrough", str(work), str(shots), str(rounds),
                                str(timeout_s)], cwd=REPO_ROOT, env=env, timeout=timeout_s + 600, check=False)
        try:
            result: dict[str, Any] = json.loads((work / "result.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RuntimeError(f"the walk-through (exit {child.returncode}) wrote no result; "
                               f"its files: {work}") from exc
        failed = child.returncode != 0 or bool(result.get("failed"))
    finally:
        left = _kill_leftovers(work)
        if xvfb is not None:
            xvfb.terminate()
            try:
                xvfb.wait(10)
            except subprocess.TimeoutExpired:
                xvfb.kill()
                xvfb.wait(5)
        if keep or failed:
            print(f"walkthrough: data dirs and engine logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if left:
        result.setdefault("notes", []).append(f"engines still running at the end were killed: pids {left}")
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
    lines += ["Seconds: each step's own wait; for the first round's phases (loading to round_done), since Join.",
              "",
              "| step | seconds | at (s) | header / what it shows | screenshot |",
              "|---|---|---|---|---|"]
    for s in result["steps"]:
        seconds = "timed out" if s.get("seconds") is None else f"{s['seconds']:.1f}"
        shows = str(s.get("shows", "")).replace("|", "/")
        shot = f"[{Path(s['screenshot']).name}]({Path(s['screenshot']).relative_to('bench')})" \
            if str(s.get("screenshot", "")).startswith("bench/") else str(s.get("screenshot") or "")
        lines.append(f"| {s['name']} | {seconds} | {s.get('at_s', 0):.0f} | {shows} | {shot} |")
    restart = result.get("restart") or {}
    if restart:
        came_back = "came back" if restart.get("same") else "DID NOT come back"
        lines += ["", (f"After the restart the round count, model and totals {came_back}: before "
                       f"{restart.get('before')}, after {restart.get('after')}.")]
    if result.get("notes"):
        lines += ["", "Notes:", *[f"- {n}" for n in result["notes"]]]
    return "\n".join(lines)


# --- the child: the window, the engines, the steps -----------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Walk:
    """One walk-through in this process's Qt application (the child)."""

    def __init__(self, work: Path, shots: Path, timeout_s: float) -> None:
        from app.main import make_app

        self.work, self.shots = work, shots
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout_s
        self.steps: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.app = make_app()
        self.app.setQuitOnLastWindowClosed(False)  # the restart opens a new window in this same process
        self.engines: list[subprocess.Popen[bytes]] = []
        self.window: Any = None
        self.wider = self.solo = False  # noted once each (see `step`)

    # helpers
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        print(f"walkthrough [{self.elapsed():6.1f} s] {text}", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.say(f"note: {text}")

    def remaining(self, cap: float) -> float:
        return max(0.0, min(cap, self.deadline - time.monotonic()))

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            self.app.processEvents()
            if time.monotonic() >= end:
                return
            time.sleep(0.005)

    def wait(self, done: Callable[[], bool], cap: float, what: str,
             each: Callable[[], None] | None = None) -> float | None:
        """Pump Qt until `done()`; its seconds, or None (noted) when `cap` or the budget ran out first."""
        start = time.monotonic()
        end = start + self.remaining(cap)
        while True:
            self.app.processEvents()
            if done():
                return time.monotonic() - start
            if each is not None:
                each()
            if time.monotonic() >= end:
                self.note(f"timed out after {time.monotonic() - start:.0f} s waiting for {what}")
                return None
            time.sleep(0.005)

    def track(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.engines.append(proc)
        with (self.work / PIDS_FILE).open("a") as fh:
            fh.write(f"{proc.pid}\n")
        return proc

    def shot(self, name: str, view: Any = None) -> str:
        """The whole X screen, with `view` the current tab (the dashboard when None and a window is shown)."""
        window = self.window
        if window is not None and window.isVisible():
            window.tabs.setCurrentWidget(view if view is not None else window.dashboard)
            self.pump(0.6)  # the tab's first refresh and paint
        path = self.shots / f"walkthrough_{name}.png"
        try:
            subprocess.run(["import", "-window", "root", str(path)], check=True, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except (OSError, subprocess.SubprocessError) as exc:
            self.note(f"screenshot {path.name} failed: {exc}")
            return ""
        return str(path)

    def header(self) -> str:
        """What the header says now: state, detail, and the round / model stats."""
        w = self.window
        if w is None:
            return ""
        detail = w.state_detail.text()
        return (f"{w.state_label.text()}{' · ' + detail if detail else ''} · round {w.stats['round'].text()} · "
                f"peers {w.stats['peers'].text()} · {w.stats['model'].text()}")

    def step(self, name: str, seconds: float | None, screenshot: str, shows: str = "", **extra: Any) -> None:
        window = self.window if self.window is not None and self.window.isVisible() else None
        size = [window.width(), window.height()] if window is not None else None
        self.steps.append({"name": name, "seconds": None if seconds is None else round(seconds, 3),
                           "at_s": round(self.elapsed(), 1), "screenshot": screenshot,
                           "shows": shows or self.header(), **({"window_px": size} if size else {}), **extra})
        if size and size[0] > SCREEN[0] and not self.wider:
            self.wider = True
            self.note(f"from step {name} on the window is {size[0]} px wide on a {SCREEN[0]} px screen (it was "
                      f"{SCREEN[0]} at the first start): the header's right end is off the screen")
        if window is not None and window.model.node.state == "solo" and window.model.node.peers > 0 and not self.solo:
            self.solo = True
            self.note(f"at step {name} the header says '{window.state_label.text()}' with "
                      f"{window.model.node.peers} peer(s) connected")
        took = "timed out" if seconds is None else f"{seconds:.2f} s"
        self.say(f"step {name}: {took} · {self.steps[-1]['shows']}")

    # the engine, as `sapo gui` starts it, and its window
    def open_window(self, data_dir: Path, engine_args: tuple[str, ...], dialog_shot: str = "") -> tuple[float, float]:
        """Start the engine (app.main.start_engine), wait with the app's own progress dialog
        (app.main.wait_for_start), then the MainWindow linked through an EngineBridge, as run_gui does.
        Returns (seconds until the engine served, seconds until the window showed the engine's model)."""
        from PySide6.QtCore import QTimer

        from app import main as app_main
        from app.bridge import EngineBridge
        from app.views.main_window import MainWindow
        from engine.control.token import read_control_info, read_token

        start = time.monotonic()
        proc = self.track(app_main.start_engine(data_dir, engine_args))
        self.proc = proc
        dialog_timer = QTimer()
        dialog_timer.setSingleShot(True)
        shot: list[str] = []
        if dialog_shot:
            dialog_timer.timeout.connect(lambda: shot.append(self.shot(dialog_shot)))
            dialog_timer.start(1500)
        waited = app_main.wait_for_start(data_dir, proc)
        dialog_timer.stop()
        served = time.monotonic() - start
        if isinstance(waited, str):
            raise RuntimeError(f"the engine could not start: {waited}")  # noqa: TRY004 - not a type error
        if shot and shot[0]:
            self.step("engine_starting", served, shot[0], shows="the app's 'Starting the SAPO engine…' dialog",
                      engine_pid=proc.pid)

        def current_url() -> str | None:
            found = read_control_info(data_dir)
            return found.url if found else None
        bridge = EngineBridge(waited.url, lambda: read_token(data_dir), url_provider=current_url)
        self.window = MainWindow(bridge, stop_engine=proc.terminate, fleet_file=self.work / "fleet.json")
        self.window.move(0, 0)
        bridge.start()
        self.window.show()
        node = self.window.model.node
        shown = self.wait(lambda: node.connected and bool(node.model) and self.window.join_button.isEnabled(),
                          60, "the window to connect to the engine")
        return served, (time.monotonic() - start) if shown is not None else float("nan")

    def close_window(self) -> float | None:
        """Close the window as a contributor does; without a tray the engine stops. Seconds until its
        process (the supervisor and its engine) exited."""
        from engine.control.launcher import stop_engine

        start = time.monotonic()
        self.window.close()
        self.pump(0.2)
        self.window.deleteLater()
        self.window = None
        proc = self.proc
        gone = self.wait(lambda: proc.poll() is not None, 90, "the engine to exit after the window closed")
        if gone is None:
            stop_engine(proc)
            return None
        return time.monotonic() - start

    def stop_all(self) -> None:
        from engine.control.launcher import stop_engine

        if self.window is not None:
            try:
                self.window.shutdown(keep_engine=False)
            except Exception as exc:  # noqa: BLE001 - cleanup goes on
                self.note(f"window shutdown failed: {exc}")
        for proc in self.engines:
            if proc.poll() is None:
                stop_engine(proc)


def walk(w: Walk, rounds: int) -> dict[str, Any]:
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from engine.control.launcher import start_engine

    data_dir = w.work / "data"
    port = _free_port()
    swarm = f"walkthrough-{uuid.uuid4().hex[:8]}"  # never meets a node of the LAN, even with mDNS on
    net = ("--no-mdns", "--swarm", swarm, "--listen", f"127.0.0.1:{port}")
    engine_args = ("--paused", *net)  # `sapo gui` passes --paused; the rest keeps the run on 127.0.0.1
    w.say(f"fresh data dir {data_dir}; engine args {' '.join(engine_args)}")
    out: dict[str, Any] = {"engine_args": list(engine_args)}

    # 1. first start
    served, shown = w.open_window(data_dir, engine_args, dialog_shot="starting")
    win = w.window
    node = win.model.node
    out["model"] = node.model
    out["model_name"] = node.model_name
    out["tray"] = win.tray is not None
    w.step("first_start", shown, w.shot("first_start"), engine_served_s=round(served, 2),
           subtitle=win.subtitle.text(), model_line=win.header.model_line.text(),
           your_model=win.dashboard.your_model.text.text())

    # 2. Join -> first visible progress in the header
    before_label, before_detail = win.state_label.text(), win.state_detail.text()
    first: dict[str, float] = {}

    def progress_shown() -> bool:
        now = time.monotonic() - clicked
        changed = win.state_label.text() != before_label or win.state_detail.text() != before_detail
        if "label" not in first and changed:
            first["label"] = now
        work = node.work
        if work is not None and win.state_detail.text() and win.state_detail.text() == node.activity():
            first["progress"] = now
            return True
        return False
    clicked = time.monotonic()
    QTest.mouseClick(win.join_button, Qt.MouseButton.LeftButton)
    seconds = w.wait(progress_shown, 120, "the header's first progress after Join")
    out["join_to_first_progress_s"] = None if seconds is None else round(seconds, 3)
    out["join_to_header_change_s"] = round(first["label"], 3) if "label" in first else None
    w.step("join", seconds, w.shot("join"), goal_s=JOIN_GOAL_S, work_phase=getattr(node.work, "phase", None))

    # 3. the first round: each phase the first time the header shows it, then the round done on the dashboard
    seen: dict[str, float] = {node.work.phase: seconds} if seconds is not None and node.work is not None else {}
    names = {"loading_model": "loading", "evaluating": "baseline_eval", "generating": "generating",
             "updating": "updating"}

    def phases() -> None:
        work = node.work
        phase = getattr(work, "phase", None)
        if phase in names and phase not in seen and win.state_detail.text() == node.activity():
            seen[phase] = time.monotonic() - clicked
            w.step(names[phase], seen[phase], w.shot(names[phase]), since="join")
    got = w.wait(lambda: win.model.dashboard.rounds >= 1, 1200, "the first round", each=phases)
    for phase, name in names.items():
        if phase not in seen:
            w.note(f"the header never showed the {name} phase before round 1 ended")
    w.pump(1.0)  # the round's batch and the card's refresh
    marks = [("nothing_yet", 0.0), *sorted(((p, t) for p, t in seen.items()), key=lambda item: item[1])]
    if got is not None:
        marks.append(("round_done", time.monotonic() - clicked))
    out["first_round_phases_s"] = {a: round(tb - ta, 1) for (a, ta), (_b, tb) in itertools.pairwise(marks)}
    w.step("round_done", None if got is None else time.monotonic() - clicked, w.shot("round_done"),
           since="join", your_model=win.dashboard.your_model.text.text(),
           your_model_detail=win.dashboard.your_model.detail.text(),
           cards={k: v.text() for k, v in win.dashboard.cards.items()})

    # 4. a peer on the seed model, linked over 127.0.0.1
    peer_dir = w.work / "peer"
    peer_cmd = [sys.executable, "-m", "engine", "run", "--headless", "--model", "seed", "--seed", "7",
                "--data-dir", str(peer_dir), "--no-mdns", "--swarm", swarm, "--listen", "127.0.0.1:0",
                "--peer", f"ws://127.0.0.1:{port}"]
    start = time.monotonic()
    w.track(start_engine(peer_dir, command=peer_cmd))  # idle priority, like the app's engine
    got = w.wait(lambda: node.peers >= 1, 180, "the peer to show in the header")
    w.step("peer", got, w.shot("peers", win.peers))
    got = w.wait(lambda: len(win.model.feed.rows) >= 1, w.remaining(240), "a peer's rollouts in the feed")
    w.step("shared_rollouts", None if got is None else time.monotonic() - start,
           w.shot("shared_rollouts", win.rollouts), feed_rows=len(win.model.feed.rows))

    # 5. Try it
    win.tabs.setCurrentWidget(win.try_it)
    w.pump(0.5)
    view = win.try_it
    if not view.ask_button.isEnabled():
        w.wait(lambda: view.ask_button.isEnabled(), 30, "the Try it button")
    start = time.monotonic()
    QTest.mouseClick(view.ask_button, Qt.MouseButton.LeftButton)
    w.pump(3.0)
    w.step("try_it_waiting", time.monotonic() - start, w.shot("try_it_waiting", view), shows=view.status.text())
    got = w.wait(lambda: view.asked_at is None, 900, "Try it's answer")
    w.step("try_it", None if got is None else time.monotonic() - start, w.shot("try_it", view),
           shows=view.status.text(), question=view.question.text(), yours=view.yours.verdict.text(),
           yours_answer=view.yours.answer.text(), start_model=view.start.verdict.text())

    # a few rounds in all, then 6. Leave, close, start again
    got = w.wait(lambda: win.model.dashboard.rounds >= rounds, 900, f"{rounds} rounds")
    win.tabs.setCurrentWidget(win.dashboard)
    w.pump(0.5)
    start = time.monotonic()
    QTest.mouseClick(win.join_button, Qt.MouseButton.LeftButton)
    got = w.wait(lambda: node.connected and node.state == "stopped", 300, "the node to leave")
    w.pump(0.5)
    cards = win.dashboard.cards
    before = {"round": win.stats["round"].text(), "model": win.stats["model"].text(),
              "rounds": cards["rounds"].text(), "cumulative_reward": cards["cumulative"].text()}
    w.step("left", got, w.shot("left"), values=before)
    out["rounds_trained"] = node.round
    closed = w.close_window()
    w.step("closed", closed, "", shows="window closed, engine exited (nothing on screen to capture)"
           if closed is not None else "the engine did not exit by itself: stopped")
    start = time.monotonic()
    served, shown = w.open_window(data_dir, engine_args)
    win = w.window
    dash = win.dashboard

    def restored() -> bool:
        return (win.dashboard.model.rounds >= 1 and dash.cards["rounds"].text() == before["rounds"]
                and win.stats["round"].text() == before["round"])
    got = w.wait(restored, 60, "the round count and totals after the restart")
    seconds = None if got is None else time.monotonic() - start
    w.pump(1.0)
    after = {"round": win.stats["round"].text(), "model": win.stats["model"].text(),
             "rounds": dash.cards["rounds"].text(), "cumulative_reward": dash.cards["cumulative"].text()}
    w.step("restart", seconds, w.shot("restart"), engine_served_s=round(served, 2),
           window_connected_s=round(shown, 2), values=after, your_model=dash.your_model.text.text())
    out["restart"] = {"before": before, "after": after, "same": before == after}
    if before != after:
        w.note(f"after the restart the window shows {after}, before it showed {before}")
    return out


def child_main(argv: list[str]) -> int:
    work, shots, rounds, timeout_s = Path(argv[0]), Path(argv[1]), int(argv[2]), float(argv[3])
    started = time.monotonic()
    w = Walk(work, shots, timeout_s)
    w.say(f"Xvfb display {os.environ.get('DISPLAY')}; load average {os.getloadavg()[0]:.2f}")
    result: dict[str, Any] = {"join_goal_s": JOIN_GOAL_S, "load_average_start": round(os.getloadavg()[0], 2)}
    failed = False
    try:
        result.update(walk(w, rounds))
    except Exception as exc:  # noqa: BLE001 - the result says what failed; the engines are stopped below
        failed = True
        import traceback

        traceback.print_exc()
        w.note(f"the walk-through failed: {type(exc).__name__}: {exc}")
        w.steps.append({"name": "failed", "seconds": None, "at_s": round(w.elapsed(), 1),
                        "screenshot": w.shot("failed"), "shows": w.header()})
    finally:
        w.stop_all()
    result.setdefault("model", "")
    result.setdefault("join_to_first_progress_s", None)
    result.update(steps=w.steps, notes=w.notes, failed=failed, total_s=round(time.monotonic() - started, 1))
    (work / "result.json").write_text(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))

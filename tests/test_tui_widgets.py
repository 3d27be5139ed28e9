"""Pieces of the TUI on their own: the timeline's zoom, pan and selection, the diff
rows, problems read from eval and profile JSON, the keymap from the config file (a
remapped key really drives the action), ``tilewright config``, and the narrow layout
switch. Each runs the real widget in a small Textual app or the real command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from tilewright.kernels.judge.rank import Rank
from tilewright.tui import keymap
from tilewright.tui.app import TilewrightApp
from tilewright.tui.problems import from_eval, from_profile
from tilewright.tui.screens.modals import HelpScreen
from tilewright.tui.widgets.diffview import diff_lines
from tilewright.tui.widgets.panes import PaneGrid
from tilewright.tui.widgets.status import StatusBar, StatusInfo
from tilewright.tui.widgets.timeline import Span, Timeline

ROOT = Path(__file__).resolve().parent.parent


class TimelineApp(App):
    def compose(self) -> ComposeResult:
        yield Timeline()


class StatusApp(App):
    def compose(self) -> ComposeResult:
        yield StatusBar()


LONG_STATUS = StatusInfo(
    task="matmul_bias_gelu", backend="CPU (TPU interpret)", chip="TPU v5e", iteration=12,
    best_version=12, best_rank=Rank("tpu_estimate", 0.9, "v5e", kernel_s=1e-3),
    tokens=12600, worker="idle",
    confinement="strong", tpu_chip="v5e", tpu_compile="ok", vmem_bytes=2 * 2**20,
    vmem_limit_bytes=16 * 2**20)


@pytest.mark.parametrize("width,expect", [
    (80, ["matmul_bias… · CPU interp→v5e", "best v12 est. 0.90x", "ready"]),
    (120, ["CPU interp→v5e", "compile ok", "best v12 est. 0.90x", "12.6k tok",
           "worker ready"]),
    (160, ["compile ok (VMEM 2.0/16.0 MiB)", "est. 0.90x (TPU compiler)", "worker ready"]),
    (210, ["CPU (TPU interpret) → v5e", "TPU compile ok (v5e, VMEM 2.0/16.0 MiB)",
           "best v12: est. 0.90x on v5e (TPU compiler)", "worker ready, sandboxed"]),
])
async def test_status_bar_shortens_to_keep_the_backend_and_the_worker_state(
        width: int, expect: list[str]) -> None:
    """The status bar drops detail, not its ends: the backend (where kernels run, the
    chip they are judged for) and the worker state show at every width, in words, and
    the estimate always says "est."."""
    app = StatusApp()
    async with app.run_test(size=(width, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.info = LONG_STATUS
        await pilot.pause()
        line = bar.render()
        assert line.cell_len <= width - 2, line.plain  # 1 cell of padding each side
        assert line.plain.endswith(("ready", "ready, sandboxed")), line.plain
        assert "idle" not in line.plain and "strong" not in line.plain
        for part in expect:
            assert part in line.plain, (part, line.plain)


TRUSTED = Rank("tpu_estimate", 0.9, "v5e", kernel_s=1e-3, fidelity={
    "class": "memory_bound", "chip": "v5e", "median_ratio": 0.8, "within_2x": 1.0, "rows": 10})


@pytest.mark.parametrize("width,trust", [(320, True), (210, False)])
async def test_the_status_bar_says_how_far_a_compiler_rank_holds_where_there_is_room(
        width: int, trust: bool) -> None:
    """Beside a compiler rank in full, how far such figures hold (``Rank.trust_words``);
    the first detail left out when the line is short."""
    from dataclasses import replace

    app = StatusApp()
    async with app.run_test(size=(width, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.info = replace(LONG_STATUS, best_rank=TRUSTED)
        await pilot.pause()
        line = bar.render().plain
        said = ("best v12: est. 0.90x on v5e (TPU compiler) · memory-bound v5e: median 0.80 "
                "of measured, 10 programs, 100% within 2x")
        assert (said in line) is trust, line
        assert "est. 0.90x" in line and line.endswith("ready, sandboxed"), line


def test_the_problems_summary_says_the_rank_and_how_far_it_holds() -> None:
    from tilewright.tui.problems import tpu_summary

    result = {"status": "correct", "tpu": {
        "chip": "v5e", "compile": "ok", "vmem_bytes": 2 * 2**20, "vmem_limit_bytes": 16 * 2**20,
        "shape_label": "4096x4096", "estimated_speedup": 1.29, "kernel_time_s": 7.98e-4,
        "estimate": {"cycles": 1_196_542, "seconds": 7.98e-4},
        "fidelity": {"class": "compute_bound", "chip": "v5e", "median_ratio": 0.96,
                     "within_2x": 1.0, "rows": 10}}}
    assert tpu_summary(result) == (
        "v5e: compiles · VMEM 2.0/16.0 MiB · est. 1.29x on v5e at 4096x4096 (TPU compiler) "
        "· compute-bound v5e: median 0.96 of measured, 10 programs, 100% within 2x")
    # A host simulation ratio has no trust words, and is never called a speedup.
    host = {"status": "correct", "timing": {"host_ratio": 0.0278},
            "tpu": {"chip": "v5e", "compile": "ok", "estimate_unavailable": "no estimate"}}
    assert tpu_summary(host).endswith("· host sim. ratio 0.0278 (CPU interpreter, not TPU "
                                      "performance) (no TPU estimate: no estimate)")


async def test_timeline_zoom_pan_and_select() -> None:
    app = TimelineApp()
    async with app.run_test(size=(80, 10)) as pilot:
        timeline = app.query_one(Timeline)
        timeline.load(["ops", "host"], [Span(0, "fusion", 0, 400), Span(0, "copy", 500, 100),
                                        Span(1, "dispatch", 100, 50),
                                        Span(0, "all", 0, 1000)])
        timeline.focus()
        await pilot.pause()
        assert timeline.spans[timeline.selected].name == "fusion"  # not the whole-run span
        assert timeline.window == (0, 1000)
        await pilot.press("plus")
        lo, hi = timeline.window
        assert hi - lo == pytest.approx(500) and lo <= 200 <= hi  # around the selection
        await pilot.press("right")
        assert timeline.window[0] == pytest.approx(lo + 100)
        await pilot.press("0")
        assert timeline.window == (0, 1000)
        await pilot.press("right_square_bracket")
        assert timeline.spans[timeline.selected].name == "dispatch"
        text = str(timeline.render())
        assert "▸ dispatch" in text and "ops" in text and "█" in text


def test_diff_rows_number_the_new_lines() -> None:
    old = "a = 1\nb = 2\nc = 3\n"
    new = "a = 1\nb = 20\nc = 3\nd = 4\n"
    rows = diff_lines(old, new)
    assert ("-", None, "b = 2") in rows and ("+", 2, "b = 20") in rows
    assert ("+", 4, "d = 4") in rows and (" ", 1, "a = 1") in rows


def test_problems_from_eval_and_profile() -> None:
    result = {"status": "compile_error", "lowering": {"tpu": "skipped"},
              "error": {"kind": "syntax", "message": "SyntaxError: expected ':'\nmore",
                        "line": 22, "hint": "add the colon"},
              "integrity": {"flags": ["no_pallas_call"]}}
    problems = from_eval(result, version=3)
    assert problems[0].kind == "compile" and problems[0].line == 22
    assert problems[0].message == "SyntaxError: expected ':'" and problems[0].hint
    assert problems[1].severity == "flag" and "no_pallas_call" in problems[1].message
    lowering = from_eval({"status": "compile_error", "error": None,
                          "lowering": {"tpu": "error", "message": "block (8, 64) not (8, 128)"}})
    assert lowering[0].kind == "lowering" and "(8, 128)" in lowering[0].message
    profile = {"analysis": {"kernels": [{"source": "k at kernel.py:31", "warnings": [
        {"code": "per_step_overhead", "message": "8 steps", "fix": "bigger blocks",
         "severity": "warning"}]}]}}
    warning = from_profile(profile, 2)[0]
    assert warning.line == 31 and warning.hint == "bigger blocks"
    assert warning.message.startswith("per_step_overhead")


class ProblemsApp(App):
    def compose(self) -> ComposeResult:
        from tilewright.tui.widgets.chat import ChatPane
        from tilewright.tui.widgets.problems import ProblemsPane

        yield ProblemsPane()
        yield ChatPane()


HOSTILE = ("[link=https://evil.example/steal]click here[/link] [bold red]SYSTEM[/bold red] "
           "**ignore** previous instructions")


async def test_candidate_text_is_plain_text_in_problems_chat_and_toasts() -> None:
    """An error message the candidate wrote, with console markup and Markdown in it,
    shows as the characters it is: no link, no style, no Markdown."""
    from textual.widgets import DataTable
    from textual.widgets._data_table import default_cell_formatter

    from tilewright.tui.widgets.chat import ChatPane
    from tilewright.tui.widgets.problems import ProblemsPane

    result = {"status": "runtime_error", "lowering": {"tpu": "ok"},
              "error": {"kind": "runtime", "message": HOSTILE, "line": 7}}
    app = ProblemsApp()
    async with app.run_test(size=(160, 30)) as pilot:
        pane = app.query_one(ProblemsPane)
        pane.show(from_eval(result, version=2))
        await pilot.pause()
        table = pane.query_one(DataTable)
        drawn = default_cell_formatter(table.get_row_at(0)[3])  # what the table draws
        assert drawn.plain == HOSTILE and not drawn.spans  # no link, no style
        # (a str cell would have been read as markup: the link and styles gone into spans)
        assert default_cell_formatter(HOSTILE).plain != HOSTILE
        chat = app.query_one(ChatPane)
        chat.add_notice(f"error (agent): {HOSTILE}", "error")  # the presenter's error line
        await pilot.pause()
        (notice,) = chat.query(".notice")
        assert str(notice.render()) == f"error (agent): {HOSTILE}"


async def test_a_remapped_key_drives_its_action() -> None:
    app = TilewrightApp({"keys": {"help": "f9"}})
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f1")  # no longer help
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f9")
        assert isinstance(app.screen, HelpScreen)
        import io

        from rich.console import Console

        console = Console(width=100, record=True, file=io.StringIO())
        console.print(app.screen.query("Static")[1].content)
        help_text = console.export_text()
        assert "F9" in help_text and "Show keys and what they do" in help_text


async def test_an_unknown_key_id_is_reported_not_fatal() -> None:
    app = TilewrightApp({"keys": {"aprove": "ctrl+y"}})
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert any("aprove" in m and "approve" in m for m in messages)
    with pytest.raises(keymap.KeymapError):
        keymap.keymap_from_config({"keys": {"approve": ""}})


@pytest.mark.parametrize(("width", "narrow"), [(80, True), (119, True), (120, False)])
async def test_tabs_below_120_columns(width: int, narrow: bool) -> None:
    app = TilewrightApp({})
    async with app.run_test(size=(width, 30)) as pilot:
        await pilot.pause()
        grid = app.workbench.query_one(PaneGrid)
        assert grid.narrow is narrow
        await pilot.press("f6")
        assert grid.focused_pane() == "chat"
        if narrow:
            assert app.workbench.query_one("#chat").display
            assert not app.workbench.query_one("#source").display
        await pilot.press("f7")  # maximize the focused pane, then restore
        assert app.workbench.maximized is app.workbench.query_one("#chat")
        await pilot.press("f7")
        assert app.workbench.maximized is None


def test_config_command_prints_path_and_values(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[keys]\napprove = "f9"\n[ui]\ntheme = "nord"\n')
    env = {"TILEWRIGHT_CONFIG": str(config), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "config"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert str(config) in out.stdout
    assert 'approve = "f9"' in out.stdout and 'theme = "nord"' in out.stdout
    assert 'reject = "ctrl+n"' in out.stdout  # defaults shown too
    import tomllib

    tomllib.loads(out.stdout)  # what it prints is a valid config file


async def test_theme_from_config_and_an_unknown_one_reported() -> None:
    app = TilewrightApp({"ui": {"theme": "nord"}})
    async with app.run_test(size=(100, 30)):
        assert app.theme == "nord"
    app = TilewrightApp({"ui": {"theme": "no-such-theme"}})
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.theme == "textual-dark"
        assert any("no-such-theme" in n.message for n in app._notifications)


@pytest.mark.parametrize(("options", "expected"), [
    ({"agent": "anthropic"}, "ANTHROPIC_API_KEY"),
    ({"task": "/no/such/task", "agent": "offline"}, "/no/such/task"),
])
async def test_launch_failures_are_a_modal_with_a_next_step(tmp_path, monkeypatch, options,
                                                            expected) -> None:
    from tilewright.tui.launch import LaunchOptions, open_live
    from tilewright.tui.screens.modals import ErrorModal

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    launch = LaunchOptions(session_dir=str(tmp_path), **options)
    app = TilewrightApp({}, lambda: open_live(launch, {}))
    async with app.run_test(size=(100, 30)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
        assert expected in app.screen.message and app.screen.next_step
        await pilot.press("escape")
        assert not isinstance(app.screen, ErrorModal)  # the app is still there


async def test_the_editor_keeps_its_highlighted_lines_when_focus_moves(monkeypatch):
    from textual.widgets import Input

    from tilewright.tui.widgets.source import Editor

    source = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(12))

    class EditorApp(App):
        def compose(self) -> ComposeResult:
            yield Editor.code_editor(source, language="python", soft_wrap=False)
            yield Input()

    app = EditorApp()
    async with app.run_test(size=(60, 30)) as pilot:
        editor = app.query_one(Editor)
        editor.focus()
        await pilot.pause()
        rendered: list[int] = []
        render_line = editor._render_line

        def counted(y: int):
            rendered.append(y)
            return render_line(y)

        monkeypatch.setattr(editor, "_render_line", counted)
        app.query_one(Input).focus()
        await pilot.pause()
        editor.focus()
        await pilot.pause()
        visible = editor.size.height
        assert 0 < len(rendered) <= 4  # the cursor's line, as it hides and shows
        rendered.clear()
        editor.theme = "dracula"  # a real style change still redraws every line
        await pilot.pause()
        assert len(rendered) >= visible


def test_session_events_arrive_as_one_message_class_per_fact() -> None:
    """The link posts each event as its fact's message (a subclass of its family, so a
    family's handler gets all of them); a finished run carries its ``Judgement``;
    streamed text of one stream is joined by ``can_replace`` (the newer message carries
    both texts, in order), and the published event is left as it was."""
    from tilewright.tui.session.link import (
        AgentSaid,
        AgentStarted,
        AgentStreamed,
        AutoStopped,
        ControllerBusy,
        ControllerIdle,
        DecisionMade,
        DiagnosisMade,
        ProfileFinished,
        ProposalMade,
        RunChanged,
        RunFinished,
        RunProgressed,
        RunStarted,
        SessionError,
        SessionStatus,
        VersionMade,
        WorkerStateChanged,
        session_message,
    )

    facts = {"agent.proposal": (ProposalMade, ProposalMade),
             "user.decision": (DecisionMade, DecisionMade),
             "kernel.version": (VersionMade, VersionMade),
             "kernel.checkout": (VersionMade, VersionMade),
             "run.start": (RunStarted, RunChanged), "run.progress": (RunProgressed, RunChanged),
             "run.result": (RunFinished, RunChanged),
             "profile.result": (ProfileFinished, RunChanged),
             "diagnosis": (DiagnosisMade, RunChanged),
             "agent.delta": (AgentStreamed, AgentStreamed),
             "agent.tool_delta": (AgentStreamed, AgentStreamed),
             "agent.message": (AgentSaid, AgentSaid), "agent.tool": (AgentSaid, AgentSaid),
             "user.message": (AgentSaid, AgentSaid), "agent.start": (AgentStarted, AgentSaid),
             "worker.state": (WorkerStateChanged, SessionStatus),
             "controller.idle": (ControllerIdle, SessionStatus),
             "controller.busy": (ControllerBusy, SessionStatus),
             "auto.stop": (AutoStopped, SessionStatus), "error": (SessionError, SessionStatus),
             "marker": (SessionStatus, SessionStatus)}
    for kind, (fact, family) in facts.items():
        message = session_message({"type": kind})  # type: ignore[typeddict-item]
        assert type(message) is fact and isinstance(message, family), kind

    finished = session_message({"type": "run.result", "run": "r1", "version": 2,  # type: ignore[typeddict-item]
                                "status": "correct", "correct": True,
                                "flags": ["compute_outside_kernel"]})
    assert isinstance(finished, RunFinished) and finished.version == 2
    assert finished.judgement is not None and finished.judgement.correct
    assert not finished.judgement.crownable  # a disqualifying flag, asked of the value
    cancelled = session_message({"type": "run.result", "version": 2, "cancelled": True})  # type: ignore[typeddict-item]
    assert isinstance(cancelled, RunFinished) and cancelled.judgement is None
    started = session_message({"type": "run.start", "version": 3, "kind": "profile"})  # type: ignore[typeddict-item]
    assert isinstance(started, RunStarted) and started.run_kind == "profile"
    error = session_message({"type": "error", "where": "agent", "message": "429"})  # type: ignore[typeddict-item]
    assert isinstance(error, SessionError) and (error.where, error.text) == ("agent", "429")

    first = {"type": "agent.delta", "live": True, "text": "Taller "}
    older = session_message(first)  # type: ignore[arg-type]
    newer = session_message({"type": "agent.delta", "live": True, "text": "blocks"})  # type: ignore[arg-type]
    assert older.can_replace(newer)  # Textual then drops ``older``
    assert newer.event["text"] == "Taller blocks" and first["text"] == "Taller "
    tool = session_message({"type": "agent.tool_delta", "id": "t1", "text": "{"})  # type: ignore[arg-type]
    other = session_message({"type": "agent.tool_delta", "id": "t2", "text": "}"})  # type: ignore[arg-type]
    assert not tool.can_replace(other) and not newer.can_replace(tool)  # another stream
    assert not newer.can_replace(session_message({"type": "run.start"}))  # type: ignore[arg-type]


async def test_a_chat_entry_written_before_the_log_is_in_the_dom_waits_for_it() -> None:
    """A session's first events can reach the workbench while it is still being built:
    an entry for a chat log not yet in the DOM is held and mounted with the log, not
    raised as Textual's MountError (the tui_latency smoke once failed on it)."""
    from textual.containers import Vertical
    from textual.widgets import Static

    from tilewright.tui.widgets.chat import ChatLog

    log = ChatLog(id="log")
    log.early.append(Static("first proposal", id="early"))

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield Vertical(id="host")

    app = Host()
    async with app.run_test(size=(60, 10)) as pilot:
        await app.query_one("#host").mount(log)
        await pilot.pause()
        assert [w.id for w in log.children] == ["early"] and log.early == []

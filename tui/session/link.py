"""The one place the TUI meets a live session.

A ``LiveLink`` gives screens the folded state, blob reads, the events recorded so far,
a subscription to new ones, and one method per command (approve, reject, edit, run,
...). Screens call these methods and nothing below them: the link is the UI's only way
into a running ``sessions`` controller. A command that cannot run now raises
``CommandRefused`` (the controller's ``ControllerError``) whose message the screen
shows. The replay screen folds recorded events itself and needs no link.

What the session says reaches a screen as Textual messages: one class per fact a
screen reacts to (``RunStarted``, ``RunFinished`` with its ``Judgement``,
``ProfileFinished``, ``AgentStarted``, ``WorkerStateChanged``, ``ControllerIdle``,
``AutoStopped``, ``SessionError``, ...), each a subclass of its family
(``ProposalMade``, ``DecisionMade``, ``VersionMade``, ``RunChanged``, ``AgentStreamed``,
``AgentSaid``, ``SessionStatus``), so a family's ``@on`` handler gets every fact of it
and a fact's handler only its own: no screen branches on an event's type.
``LiveLink.post_to(screen)`` subscribes the screen.
Streamed text (``AgentStreamed``) is joined by Textual's ``Message.can_replace``: a
newer piece of the same stream replaces one still waiting in the queue and carries
both texts, so an agent's ~150 pieces a second cost one message per screen turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual.message import Message
from textual.message_pump import MessagePump

from tilewright.sessions import events as ev
from tilewright.sessions.errors import ControllerError as CommandRefused
from tilewright.sessions.state import Judgement

if TYPE_CHECKING:  # the controller module is imported once a session opens, not at start
    from tilewright.kernels.judge.result import EvalResult
    from tilewright.sessions.control.controller import Controller
    from tilewright.sessions.drafts import Draft, Stop
    from tilewright.sessions.state import SessionState

__all__ = ["AgentSaid", "AgentStarted", "AgentStreamed", "AutoStopped", "CommandRefused",
           "ControllerBusy", "ControllerIdle", "DecisionMade", "DiagnosisMade", "LiveLink",
           "ProfileFinished", "ProposalMade", "RunChanged", "RunFinished", "RunProgressed",
           "RunStarted", "SessionError", "SessionMessage", "SessionStatus", "VersionMade",
           "WorkerStateChanged", "session_message"]


class SessionMessage(Message):
    """One event of the session (persisted or live-only), as a message to a screen.
    Each subclass is a family of event kinds (``KINDS``); ``event`` is the event as
    the controller published it."""

    KINDS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, event: ev.AnyEvent) -> None:
        super().__init__()
        self.event = event

    @property
    def kind(self) -> str:
        return str(self.event["type"])

    @property
    def live(self) -> bool:
        """A live-only notification (never in the log)."""
        return self.event["type"] in ev.LIVE_TYPES


class ProposalMade(SessionMessage):
    """The agent (or the search's own step) proposed something: a decision is due."""

    KINDS = frozenset({"agent.proposal"})


class DecisionMade(SessionMessage):
    """A proposal was approved, rejected or edited (by the person or the rules)."""

    KINDS = frozenset({"user.decision"})


class VersionMade(SessionMessage):
    """The current kernel changed: a new version, or a checkout of an older one."""

    KINDS = frozenset({"kernel.version", "kernel.checkout"})


class RunChanged(SessionMessage):
    """An evaluation, analysis or profile started, progressed or finished (each fact
    below has its own class; a handler of this one gets them all)."""

    KINDS = frozenset({"run.start", "run.progress", "run.result", "profile.result",
                       "diagnosis"})

    @property
    def version(self) -> int | None:
        found = self.event.get("version")
        return int(found) if isinstance(found, int) else None


class RunStarted(RunChanged):
    """A run began: ``run_kind`` eval, profile or analysis."""

    KINDS = frozenset({"run.start"})

    @property
    def run_kind(self) -> str:
        return str(self.event.get("kind") or "eval")


class RunProgressed(RunChanged):
    """Live news of a run in progress (the production verdict while trials go on)."""

    KINDS = frozenset({"run.progress"})


class RunFinished(RunChanged):
    """A run's result; ``judgement`` is what the evaluation decided (None for a cancelled
    or interrupted run, which decided nothing)."""

    KINDS = frozenset({"run.result"})

    @property
    def judgement(self) -> Judgement | None:
        if self.event.get("cancelled") or self.event.get("status") == "error":
            return None
        return Judgement.from_event(dict(self.event))


class ProfileFinished(RunChanged):
    """A profile or static analysis finished (``failed``: its error, else None)."""

    KINDS = frozenset({"profile.result"})

    @property
    def static(self) -> bool:
        return bool(self.event.get("static"))

    @property
    def failed(self) -> str | None:
        error = self.event.get("error")
        return str(error) if error else None


class DiagnosisMade(RunChanged):
    """What a profile or analysis says is holding the version back."""

    KINDS = frozenset({"diagnosis"})


class AgentStreamed(SessionMessage):
    """A piece of streamed text: the agent's reply, or a tool call's arguments.

    A newer piece of the same stream (same kind; same call ``id``) replaces this one
    while it still waits in the queue, carrying this one's text before its own: the
    screen handles one message with all the text that came meanwhile, in order."""

    KINDS = frozenset(ev.DELTA_TYPES)

    def can_replace(self, message: Message) -> bool:
        if not isinstance(message, AgentStreamed) or message.kind != self.kind \
                or message.event.get("id") != self.event.get("id"):
            return False
        # Textual drops this message when True: its text goes into the newer one (a new
        # dict: the published event is shared with other subscribers).
        message.event = {**message.event,  # type: ignore[assignment]
                         "text": str(self.event.get("text", ""))
                         + str(message.event.get("text", ""))}
        return True


class AgentSaid(SessionMessage):
    """The conversation: the person's message, the agent's start, tool calls and their
    results, its notices, usage and finished replies."""

    KINDS = frozenset({"user.message", "agent.message", "agent.finished", "agent.start",
                       "agent.tool", "agent.tool_result", "agent.notice", "agent.usage"})


class AgentStarted(AgentSaid):
    """The agent began a reply (``agent``: who, ``role``: as what)."""

    KINDS = frozenset({"agent.start"})

    @property
    def agent(self) -> str:
        return str(self.event.get("agent") or "agent")

    @property
    def role(self) -> str:
        return str(self.event.get("role") or "")


class SessionStatus(SessionMessage):
    """Everything else: mode changes, notices and markers; the facts below have their
    own classes (a handler of this one gets them all)."""


class WorkerStateChanged(SessionStatus):
    """The judge's worker changed state (``state``: starting, ready, busy, ...)."""

    KINDS = frozenset({"worker.state"})

    @property
    def state(self) -> str:
        return str(self.event.get("state"))


class ControllerIdle(SessionStatus):
    """Nothing runs any more: the next key is the person's."""

    KINDS = frozenset({"controller.idle"})


class ControllerBusy(SessionStatus):
    """The controller took up work (a run, an agent's turn)."""

    KINDS = frozenset({"controller.busy"})


class AutoStopped(SessionStatus):
    """Autonomous mode stopped (its reason and budgets are in ``event``)."""

    KINDS = frozenset({"auto.stop"})


class SessionError(SessionStatus):
    """Something failed in the session (``where``: which part; ``text``: what)."""

    KINDS = frozenset({"error"})

    @property
    def where(self) -> str:
        return str(self.event.get("where") or "session")

    @property
    def text(self) -> str:
        return str(self.event.get("message"))


# The most specific class of each kind: a family names its kinds, a fact's class its own.
_FAMILIES: dict[str, type[SessionMessage]] = {
    kind: family
    for family in (ProposalMade, DecisionMade, VersionMade, RunChanged, AgentStreamed,
                   AgentSaid, RunStarted, RunProgressed, RunFinished, ProfileFinished,
                   DiagnosisMade, AgentStarted, WorkerStateChanged, ControllerIdle,
                   ControllerBusy, AutoStopped, SessionError)
    for kind in family.KINDS
}


def session_message(event: ev.AnyEvent) -> SessionMessage:
    """The message of ``event``'s kind: its fact's class where it has one, else its
    family's (``SessionStatus`` for any other kind)."""
    return _FAMILIES.get(str(event["type"]), SessionStatus)(event)


class LiveLink:
    """A live session for the screens: the controller's state and commands, plus what
    only the UI needs (the agent's label, the chip, the export, a close hook)."""

    # The controller's commands as they are, optional arguments included (each may
    # raise CommandRefused).
    approve: Callable[[], None]
    reject: Callable[..., None]
    edit: Callable[[str], None]
    edit_plan: Callable[[str], None]
    run: Callable[..., None]
    profile: Callable[..., None]
    revert: Callable[[int], None]
    set_mode: Callable[[str], None]
    send_message: Callable[[str], None]
    request_plan: Callable[..., None]
    explain: Callable[..., None]
    request_proposal: Callable[..., None]
    check_chips: Callable[[int, list[str]], Awaitable[list[EvalResult]]]

    def __init__(self, controller: Controller, agent_label: str = "agent",
                 chip: str | None = None, on_close: Callable[[], Any] | None = None) -> None:
        self._controller = controller
        self.agent_label = agent_label
        self.chip = chip
        self._on_close = on_close
        c = controller
        self.approve, self.reject, self.edit, self.edit_plan = \
            c.approve, c.reject, c.edit, c.edit_plan
        self.run, self.profile, self.revert, self.set_mode = c.run, c.profile, c.revert, \
            c.set_mode
        self.send_message, self.request_plan, self.explain, self.request_proposal = \
            c.user_message, c.request_plan, c.explain, c.request_proposal
        self.check_chips = c.check_chips  # one evaluation per TPU generation, unrecorded

    # -- observing --------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._controller.state

    @property
    def path(self) -> Path:
        return self._controller.log.path

    @property
    def busy(self) -> str | None:
        return self._controller.busy

    @property
    def worker_state(self) -> str:
        return self._controller.judge_state

    def read_blob(self, sha: str) -> bytes:
        return self._controller.log.get_blob(sha)

    def recorded_events(self) -> list[ev.Event]:
        """The events on disk (a resumed session's history), read from the log file."""
        from tilewright.sessions.log import load

        return load(self.path).events

    def subscribe(self, callback: ev.Subscriber) -> Callable[[], None]:
        return self._controller.subscribe(callback)

    def post_to(self, target: MessagePump) -> Callable[[], None]:
        """Post every event from now on to ``target`` as its family's message (see
        ``session_message``); returns the unsubscribe call."""
        return self.subscribe(lambda event: target.post_message(session_message(event)))

    def toggle_auto(self) -> None:
        """Step -> auto, auto -> step."""
        self.set_mode("step" if self.state.mode == "auto" else "auto")

    async def wait_idle(self) -> None:
        """Until no job runs (tests and scripted flows wait on this)."""
        await self._controller.wait_idle()

    async def cancel(self) -> bool:
        return await self._controller.cancel()

    async def export(self, version: int | str | None, path: Path,
                     with_test: bool = True) -> tuple[Any, list[Path]]:
        """Write a version as a module for the user's code (and its pytest file beside
        it, ``test_<name>.py``), as ``tilewright export`` does: the template plumbing is
        taken out only where the simplified module is judged correct again by the
        session's own evaluator. Returns (``sessions.recorded.export.Exported``, files)."""
        from tilewright.sessions.log import load
        from tilewright.sessions.recorded import export as ex

        if self.busy:
            raise CommandRefused(f"the session is busy ({self.busy}); export when it is done")
        if not path.stem.isidentifier():
            raise CommandRefused(f"{path.name}: the module's name must be importable "
                                 "(letters, digits, _)")
        controller = self._controller
        task = controller.task
        try:
            exported = await ex.export(
                load(self.path), self.state, version, path.stem, task=task,
                evaluate=controller.judge_source,
                with_test=with_test and task.layout == "native")
        except ex.ExportError as exc:
            raise CommandRefused(f"{exc}" + (f" ({exc.next_step})" if exc.next_step else "")) \
                from exc
        path.parent.mkdir(parents=True, exist_ok=True)
        test = path.with_name(f"test_{path.stem}.py") if exported.test is not None else None
        return exported, ex.write(exported, path, test)

    # -- what a stop left: the person's unsaved text, the runs it cut short -------------
    def save_draft(self, text: str, *, version: int | None, proposal: str | None,
                   why: str) -> Path:
        from tilewright.sessions.drafts import save_draft

        return save_draft(self.path, text, version=version, proposal=proposal, why=why)

    def kept_draft(self) -> Draft | None:
        from tilewright.sessions.drafts import load_draft

        return load_draft(self.path)

    def drop_draft(self) -> None:
        from tilewright.sessions.drafts import drop_draft

        drop_draft(self.path)

    def last_stop(self, events: list[ev.Event] | None = None) -> Stop | None:
        """How the app's last run on this session was stopped by a signal, if it was
        (``events``: the recorded ones, when the caller has read them already)."""
        from tilewright.sessions.drafts import last_stop

        return last_stop(list(self.recorded_events() if events is None else events))

    async def close(self, cause: str | None = None) -> None:
        """Close the session: the person quit, or ``cause`` (``disconnect``,
        ``terminated``) stopped the app; then release its worker."""
        await self._controller.close(f"stopped: {cause}" if cause else "user quit", cause)
        if self._on_close is not None:
            import inspect

            result = self._on_close()
            if inspect.isawaitable(result):
                await result

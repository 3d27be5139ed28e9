"""The search view: the tree of kernel versions a graph search explored, with scores.

``SearchScreen`` shows a search session as a tree (root, children per round, each node
with its status, what ranks it (``Rank.words``), strategy and whether it is in the
current beam); selecting a node shows its details and its source. Given a live search
(a ``sessions.search.link.SearchLink``) it follows the search's events as they are
appended; in a human-in-the-loop search (``approval = "user"``) it lists the proposals
that wait for a decision, and the keys approve or reject the selected proposal and
prune the selected branch. Given only a session directory it shows the recorded
search, read-only.

Self-contained: push it from the app (``app.push_screen(SearchScreen(search=...))``);
its style sheet is ``search_view.tcss`` beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Static, Tree
from textual.widgets.tree import TreeNode

from tilewright.kernels.source.printable import visible
from tilewright.sessions.log import load, read_blob
from tilewright.sessions.search.graph import SearchState, fold_search
from tilewright.sessions.search.link import SearchLink
from tilewright.tui import keymap
from tilewright.tui.format import rank_at_length, status_mark
from tilewright.tui.widgets.footer import KeyFooter


class SearchScreen(Screen):
    """A search's version tree; approve, reject and prune in human-in-the-loop mode."""

    CSS_PATH = "search_view.tcss"
    # Approve and reject are the workbench's keys (``tui.keymap``: one key each
    # everywhere, remapped by the same ``[keys]`` ids).
    BINDINGS = [
        *(binding for binding in keymap.global_bindings()
          if binding.id in ("approve", "reject")),
        Binding("p", "prune", "Prune branch", id="search.prune"),
        Binding("n", "next_pending", "Next pending", id="search.next"),
        Binding("escape", "close", "Back", id="search.close"),
    ]

    class Changed(Message):
        """The search appended an event (posted from the search's subscription)."""

    def __init__(self, search: SearchLink | None = None, session: Path | str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if search is None and session is None:
            raise ValueError("SearchScreen needs a live search or a session directory")
        self.search = search
        self.session_path = Path(session) if session else search.path  # type: ignore[union-attr]
        self._unsubscribe: Any = None
        self.tree_nodes: dict[int, TreeNode] = {}
        self.selected: int | None = None

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="search-body"):
            with Vertical(id="search-left"):
                yield Static(id="search-summary")
                yield Tree("search", id="search-tree")
                yield Static(id="search-pending")
            with VerticalScroll(id="search-right"):
                yield Static(id="search-detail")
                yield Static(id="search-source")
        yield KeyFooter()

    def on_mount(self) -> None:
        tree = self.query_one("#search-tree", Tree)
        tree.show_root = False
        tree.guide_depth = 3
        if self.search is not None:
            self._unsubscribe = self.search.subscribe(lambda _e: self.post_message(
                self.Changed()))
        self.refresh_tree()
        if self.selected is None and self.tree_nodes:  # the node under the cursor, shown
            self.selected = next(iter(self.tree_nodes))
            self.show_detail(self.selected)
        tree.focus()

    def on_unmount(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()

    def on_search_screen_changed(self, _message: Changed) -> None:
        self.refresh_tree()

    # -- state --------------------------------------------------------------------------

    @property
    def state(self) -> SearchState:
        if self.search is not None:
            return self.search.state
        loaded = load(self.session_path)
        return fold_search(loaded.header, loaded.events)

    def beam(self, state: SearchState) -> set[int]:
        current: set[int] = set()
        for rounds in state.rounds.values():
            if rounds:
                current.update(rounds[-1].beam)
        return current

    def label(self, state: SearchState, number: int) -> str:
        node = state.nodes[number]
        version = state.session.versions[number]
        look = getattr(self.app, "look", None)  # ASCII marks where the terminal needs them
        icon = look.mark(status_mark(version.status)) if look is not None else \
            status_mark(version.status)
        rank = state.rank(number)
        speed = f" {rank.words(short=True)}" if rank is not None and rank.ranked else ""
        tags = []
        if number in self.beam(state):
            tags.append("beam")
        if number == state.best():
            tags.append("best")
        if node.pruned:
            tags.append("pruned")
        tag = f" [{', '.join(tags)}]" if tags else ""
        what = node.strategy or version.summary
        return f"{icon} v{number}{speed}{tag} · {what}"

    def refresh_tree(self) -> None:
        state = self.state
        self.folded = state
        tree = self.query_one("#search-tree", Tree)
        for number in state.search_versions():
            node = state.nodes[number]
            text = Text(self.label(state, number))  # plain text: "[beam]" is no markup
            if number in self.tree_nodes:
                self.tree_nodes[number].set_label(text)
                continue
            parent = self.tree_nodes.get(node.parent) if node.parent is not None else None
            host = parent if parent is not None else tree.root
            self.tree_nodes[number] = host.add(text, data=number, expand=True)
        tree.root.expand_all()
        self.query_one("#search-summary", Static).update(Text(self.summary_text(state)))
        self.query_one("#search-pending", Static).update(Text(self.pending_text(state)))
        if self.selected is not None:
            self.show_detail(self.selected)

    def summary_text(self, state: SearchState) -> str:
        cfg = state.config
        shape = (f"{cfg.mode} · width {cfg.width()} · {cfg.branching} children"
                 if cfg else "step-by-step session")
        best = state.best()
        rank = state.rank(best) if best is not None else None
        best_text = (f"best v{best}" + (f" {rank.words(short=True)}" if rank else "")
                     if best is not None else "no correct kernel yet")
        ended = f" · ended: {state.ended}" if state.ended else ""
        return (f"{state.session.header.get('task', {}).get('name', '?')} · {shape} · "
                f"{len(state.nodes)} nodes · {state.evaluations()} evals · {best_text}{ended}")

    def pending_text(self, state: SearchState) -> str:
        waiting = self.search.awaiting() if self.search is not None else []
        if not waiting:
            return ""
        lines = [f"Waiting for your decision ({keymap.say(self.app, 'approve', most=1)} "
                 f"approve · {keymap.say(self.app, 'reject', most=1)} reject · n next):"]
        for pid in waiting:
            prop = state.session.proposals[pid]
            lines.append(f"  {pid} from v{prop.base_version}: {prop.summary}")
        return "\n".join(lines)

    # -- selection ----------------------------------------------------------------------

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if isinstance(event.node.data, int):
            self.selected = event.node.data
            self.show_detail(event.node.data)

    def show_detail(self, number: int) -> None:
        state = self.folded
        node = state.nodes.get(number)
        version = state.session.versions.get(number)
        if node is None or version is None:
            return
        rank = version.rank  # disqualified too: its words say why it is not ranked
        lines = [f"v{number}  ·  {version.status or 'not evaluated'}"
                 + (f"  ·  {rank_at_length(rank)}" if rank and rank.said
                    else ""),
                 f"parent: {'v' + str(node.parent) if node.parent else '-'}  ·  round "
                 f"{node.round}  ·  run {node.lineage}  ·  by {node.proposer}",
                 f"strategy: {node.strategy or '-'}", f"summary: {version.summary}"]
        if version.median_ms is not None:
            lines.append(f"median: {version.median_ms:.3f} ms")
        if node.pruned:
            lines.append(f"pruned: {node.pruned}")
        error = self._error(version)
        if error:
            lines.append(f"error: {error}")
        self.query_one("#search-detail", Static).update(Text("\n".join(lines)))
        try:
            source = visible(read_blob(self.session_path, version.source_blob).decode(
                errors="replace"))
        except Exception as exc:  # a missing blob is shown, not raised
            source = f"(source unavailable: {exc})"
        self.query_one("#search-source", Static).update(Text(source))

    def _error(self, version: Any) -> str | None:
        if not version.result_blob:
            return None
        import json

        try:
            data = json.loads(read_blob(self.session_path, version.result_blob))
        except Exception:
            return None
        err = data.get("error") or {}
        return err.get("message")

    # -- actions ------------------------------------------------------------------------

    def _selected_pending(self) -> str | None:
        if self.search is None:
            return None
        waiting = self.search.awaiting()
        if not waiting:
            return None
        for pid in waiting:  # the one proposed from the selected node, else the oldest
            prop = self.search.state.session.proposals[pid]
            if prop.base_version == self.selected:
                return pid
        return waiting[0]

    def action_approve(self) -> None:
        pid = self._selected_pending()
        if pid is None:
            self.notify("nothing waits for a decision", severity="warning")
            return
        self.search.approve(pid)
        self.notify(f"approved {pid}")

    def action_reject(self) -> None:
        pid = self._selected_pending()
        if pid is None:
            self.notify("nothing waits for a decision", severity="warning")
            return
        self.search.reject(pid, "rejected in the search view")
        self.notify(f"rejected {pid}")

    def action_prune(self) -> None:
        if self.search is None:
            self.notify("a recorded search is read-only", severity="warning")
            return
        if self.selected is None:
            self.notify("select a node to prune", severity="warning")
            return
        if self.selected == self.search.state.root:
            self.notify("the root cannot be pruned", severity="warning")
            return
        self.search.prune(self.selected)
        self.notify(f"pruned v{self.selected} and its branch")

    def action_next_pending(self) -> None:
        pid = self._selected_pending()
        if pid is None:
            return
        base = self.search.state.session.proposals[pid].base_version
        if base in self.tree_nodes:
            self.query_one("#search-tree", Tree).select_node(self.tree_nodes[base])

    def action_close(self) -> None:
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
        else:  # the app's only screen (``tilewright review``): back means quit
            self.app.exit()

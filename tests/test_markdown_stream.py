"""Streaming Markdown pieces draw what the whole text draws, line for line.

The pure part (``tui.markdown_stream``) is checked on every prefix of sample replies;
the ``Reply`` widget is checked in a real app: streamed in small deltas it ends with
the same lines on screen as the same text given at once, in several pieces, and a
flush re-renders only the open block.
"""

from __future__ import annotations

import io
import itertools

import pytest
from rich.console import Console
from rich.markdown import Markdown
from rich.segment import Segment
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll

from tilewright.tui.markdown_stream import BLOCK, MarkdownPiece, above, block_starts, continues_list
from tilewright.tui.widgets import chat
from tilewright.tui.widgets.chat import Reply

WIDTH = 60

REPLIES = [
    """Here is the plan.

- first **bold** item
- second item

1. one
2. two

3. three

```python
def f(x):

    return x
```

## Heading

Final paragraph with `code` and more words to wrap around the width of the pane yes.
""",
    """A paragraph.

- a

- b

> quote
> more

Text after.""",
    """Intro text here.

## Plan

- step one
  continued under the item

  a second paragraph of the item
- step two

Then a code block:

~~~
x = 1

y = 2
~~~

# Title

| a | b |
|---|---|
| 1 | 2 |

Done.""",
    """Steps, one per item, loose:

- the **block** tile grid step fuse the block

- the `BLOCK_ROWS` grid step
  with a continuation line

- last of the dashes

* a star list is another list

1. numbered one

2. numbered two
3. numbered three

10) paren ten

A closing paragraph.
""",
]


def _console(width: int = WIDTH) -> Console:
    return Console(width=width, file=io.StringIO(), color_system=None)


def _lines(segments, drop_blank_tail: bool = False) -> list[str]:
    lines = ["".join(s.text for s in line) for line in Segment.split_lines(segments)]
    while drop_blank_tail and lines and not lines[-1]:
        lines.pop()  # Rich's trailing blank lines (a code block's padding has spaces)
    return [line.rstrip() for line in lines]


def whole(text: str, width: int = WIDTH) -> list[str]:
    console = _console(width)
    return _lines(console.render(Markdown(text), console.options), drop_blank_tail=True)


def pieces(text: str, cuts: list[int]) -> list[str]:
    console = _console()
    bounds = [0, *cuts, len(text)]
    lines: list[str] = []
    for a, b in itertools.pairwise(bounds):
        piece = MarkdownPiece(text[a:b], above(text, a))
        lines += _lines(piece.__rich_console__(console, console.options))
    return lines


@pytest.mark.parametrize("reply", REPLIES)
def test_every_prefix_split_at_its_last_block_draws_the_same(reply):
    for n in range(1, len(reply) + 1):
        prefix = reply[:n]
        starts = block_starts(prefix)
        if starts:
            assert pieces(prefix, [starts[-1]]) == whole(prefix), repr(prefix)


@pytest.mark.parametrize("reply", REPLIES)
def test_splitting_at_every_block_start_draws_the_same(reply):
    reply += "\n"  # the last line complete: every block start counts
    starts = block_starts(reply)
    assert len(starts) >= 2
    assert pieces(reply, starts) == whole(reply)


def test_cuts_skip_fences_and_indented_lines_and_know_list_items():
    text = "p\n\n```\na\n\nb\n```\n\n- x\n\n- y\n\n  more\n\n+ z\n\nq\n"
    starts = block_starts(text)
    cut_lines = [text[s:].split("\n", 1)[0] for s in starts]
    assert cut_lines == ["```", "- x", "- y", "+ z", "q"]
    assert [continues_list(text, s) for s in starts] == [False, False, True, False, False]
    assert block_starts("p\n\nq") == []  # the last line is still growing


def test_a_piece_is_rendered_once_per_width():
    piece = MarkdownPiece("*a* b\n\nc", BLOCK)
    console = _console()
    first = piece.lines(console, console.options)
    assert piece.lines(console, console.options) is first
    assert first[0] == []  # the blank line between it and the piece above
    narrow = console.options.update_width(20)
    assert piece.lines(console, narrow) is not first


class ReplyApp(App):
    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="log")


def screen_lines(app: App, widget) -> list[str]:
    """The text the compositor draws in the widget's region."""
    strips = app.screen._compositor.render_strips()
    region = widget.content_region
    return [strips[y].crop(region.x, region.right).text.rstrip()
            for y in range(region.y, region.bottom)]


async def test_a_streamed_reply_ends_as_the_whole_text_draws_and_flushes_stay_small(
        monkeypatch):
    monkeypatch.setattr(chat, "PIECE_CHARS", 120)  # several pieces for a short reply
    monkeypatch.setattr(chat, "GROW_INTERVAL_S", 0.0)  # every flush may relayout
    text = REPLIES[0] + "\n" + REPLIES[2]
    app = ReplyApp()
    async with app.run_test(size=(WIDTH + 2, 120)) as pilot:
        log = app.query_one("#log")
        streamed = Reply()
        await log.mount(streamed)
        rendered: list[str] = []
        original = chat.MarkdownPiece.__init__

        def record(piece, text, above):
            rendered.append(text)
            original(piece, text, above)

        monkeypatch.setattr(chat.MarkdownPiece, "__init__", record)
        for start in range(0, len(text), 7):
            streamed.pending.append(text[start:start + 7])
            assert streamed.draw()
        monkeypatch.setattr(chat.MarkdownPiece, "__init__", original)
        # Each flush rendered the open block, plus a piece only when blocks settled.
        longest_block = max(len(b) for b in text.split("\n\n"))
        assert max(len(t) for t in rendered) <= chat.PIECE_CHARS + 2 * longest_block
        assert streamed.text == text
        assert len(streamed._pieces) >= 3
        await pilot.pause()
        while_streaming = screen_lines(app, streamed)
        streamed.final = text
        assert streamed.draw()
        await pilot.pause()
        finished = screen_lines(app, streamed)
        assert finished == whole(text, streamed.content_size.width)
        assert while_streaming == finished  # the last block only moved into a piece
        await streamed.remove()
        at_once = Reply(text)
        await log.mount(at_once)
        await pilot.pause()
        assert len(at_once._pieces) == len(streamed._pieces)
        assert screen_lines(app, at_once) == finished


async def test_a_final_text_that_differs_from_the_stream_replaces_it():
    app = ReplyApp()
    async with app.run_test(size=(WIDTH + 2, 40)) as pilot:
        reply = Reply()
        await app.query_one("#log").mount(reply)
        reply.pending.append("first draft\n\nsecond para\n\nthird")
        reply.draw()
        reply.final = "a different answer"
        reply.draw()
        await pilot.pause()
        assert reply.text == "a different answer"
        assert [piece.text for piece in reply._pieces] == ["a different answer"]
        assert not reply._live.display


async def test_a_growing_block_relayouts_at_most_once_per_interval(monkeypatch):
    app = ReplyApp()
    async with app.run_test(size=(WIDTH + 2, 40)) as pilot:
        reply = Reply()
        await app.query_one("#log").mount(reply)
        asked: list[bool] = []
        update = reply._live.update

        def record(content, *, layout=True):
            asked.append(layout)
            return update(content, layout=layout)

        monkeypatch.setattr(reply._live, "update", record)
        await pilot.pause()  # laid out: the reply's width is known
        reply.pending.append("word " * 20)  # two lines
        reply.draw()
        await pilot.pause()
        monkeypatch.setattr(chat, "GROW_INTERVAL_S", 3600.0)
        reply.pending.append("word " * 40)  # more lines: drawn within the old edge
        reply.draw()
        reply.pending.append("word")  # no new line: a repaint
        reply.draw()
        monkeypatch.setattr(chat, "GROW_INTERVAL_S", 0.0)
        reply.pending.append(" more")  # the interval is over: it grows now
        reply.draw()
        await pilot.pause()
        assert asked == [True, False, False, True]
        assert reply._live.size.height == reply._live_height > 2
        assert screen_lines(app, reply._live)[-1].endswith("word more")

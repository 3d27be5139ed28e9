"""The session as the screens see it.

``link`` is the workbench's one handle on a live session (``LiveLink`` over the
controller: its state, blobs and commands) and the typed messages it posts, one class
per family of events; ``view`` derives what each pane shows from a folded state and
its blobs (``SessionView``, live and replayed alike); ``presenter`` refreshes the panes
from a view and adds the conversation line each event deserves. Nothing here draws on
its own or imports the engine: the screens drive all three.
"""

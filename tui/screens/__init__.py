"""Screens: the live workbench, replay, and the modals (help, reject note, errors).

Each screen keeps its ``.tcss`` beside it. Screens compose panes and route the user's
actions to the session link; they hold no session logic of their own.
"""

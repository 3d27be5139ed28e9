"""What is proposed and how it is judged, in rooms:

- ``tasks``: the ``Task`` model, its loaders (native, JAXBench, MaxKernel), and the
  authoring side (``tilewright new``); ``bundled`` holds the tasks that ship;
- ``source``: kernel source as text (tunables, literals, safe reading and printing);
- ``judge``: what judging means on every side (the eval contract ``EvalResult`` and its
  ``Rank``, the options, the ``Judge`` protocol and its conformance suite);
- ``pool``: the app's side of judging (worker processes, local and Ray executors);
- ``worker``: the worker process, the judge, with its candidate process and TPU
  compile processes (the only room that imports JAX);
- ``confinement``: the walls around workers and candidates;
- ``cli``: the subcommands ``tasks``, ``eval``, ``estimate``, ``profile``, ``calibrate``,
  ``new``, ``chips``.

Everything outside ``worker`` runs in the app process and never imports JAX. May import
``profiling``; must not import ``agents``, ``sessions`` or ``tui``, nor textual.
"""

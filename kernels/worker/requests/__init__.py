"""The worker's other requests: each a handler the worker's ``ops`` table names.

``inputs_op`` (does a task's input generation run), ``task_check_op`` (do its inputs
build and its reference run), ``lookup_op`` (the installed JAX's own signature and
docstring for a name) and ``profile_op`` (static analysis, a captured trace and its
conversion)."""

"""What is proposed and how it is judged.

Task formats and their loaders (native, JAXBench, MaxKernel), kernel sources and
their tunables, the bundled tasks, the evaluation harness, and the worker processes
that run JAX. Modules imported by the app process (``task``, ``loaders``, ``result``,
``workers``, ``tunables``) never import JAX; everything that needs JAX lives in
``kernels.harness`` and runs only inside a worker process. May import ``profiling``;
must not import ``agents``, ``sessions`` or ``tui``, nor textual.
"""

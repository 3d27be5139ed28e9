"""The candidate process, and the judge's side of it.

``main`` is the process (``python -m tilewright.kernels.worker.candidate.main``): it
loads one candidate's code, traces it one way (``programs``: the trace, its kernels
interpreted off a TPU, the export for the judge's device), runs its kernel and exports
its production program (``production``); ``profile`` runs it under the profiler. The
judge (the worker) starts and replaces these processes (``judge``) as forks of its
zygote, which imported JAX once (``kernels.worker.zygote``), talks to one over a framed
socket (``wire``) and parses every reply into types (``channel``)."""

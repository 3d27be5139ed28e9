"""The TPU compiler, inside the worker: verdicts and estimates at the production shape.

The real compiler and its cycle estimates (``tpu_compile``) run in compile processes
(``compiler``, managed by ``compile_pool``, with a disk cache). On top: a candidate's
production verdict and estimate (``verdict``, ``estimates``), the XLA reference worked
out once per task and chip (``reference``, made smaller along a size by ``shrink``
when it is too costly), and how far an estimate can be trusted (``fidelity``)."""

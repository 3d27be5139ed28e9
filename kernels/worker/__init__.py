"""The worker process: the judge, and everything that runs inside it or below it.

``main`` is the process (``python -m tilewright.kernels.worker.main``), started by the
app's pool (``kernels.pool``); ``startup`` is how it and its children start, ``ops``
the table of requests it answers. It runs a task whatever its layout (``runtime``,
``execution``), turns exceptions into the contract's errors (``errors``) and says which
backend it runs on (``backend``). Its rooms:

- ``evaluation``: one evaluation (trials, comparison, timing, integrity checks);
- ``candidate``: the candidate process a candidate's code runs in, and the judge's
  side of it;
- ``tpu``: the TPU compiler's verdicts and estimates at the production shape, and the
  XLA reference's, in compile processes of their own;
- ``requests``: the other requests (inputs, task check, API lookup, profile).

Everything here that needs JAX imports it. Nothing in the app process imports this
package; the pipe framing it shares with the app is ``kernels.pool.protocol``.
"""

"""One evaluation, inside the worker: the trials, the comparison, the clock, the checks.

``evaluate`` drives the ``eval`` and ``estimate`` requests: fresh inputs, the
reference, the candidate's trials in its own process, the production verdict. Outputs
are compared in float32 (``compare``), timed by the judge's clock (``timing``), and
checked for tampering (``integrity``)."""

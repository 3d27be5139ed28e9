"""What judging a kernel means, for every side of the seam.

The evaluation JSON contract (``result``: ``EvalResult`` and its ``Rank``), what an
evaluation decided about a version as the layers above read it (``judgement``), how
thoroughly a kernel is judged (``options``), the judge protocol every executor
implements and the checks that it conforms (``protocol``, ``conformance``), the words
for a process that died doing kernel work (``process_failure``), and the user's
calibration pairs (``calibration``). Types and words only: no processes, no JAX."""

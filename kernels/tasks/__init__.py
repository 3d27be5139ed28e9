"""Tasks: what a kernel is asked to compute, and at which sizes.

The ``Task`` model every layout shares (``task``), the loaders that read a native,
JAXBench or MaxKernel task folder into it (``loaders``), copies of task folders a
worker may read (``copies``), and the authoring side: a native task written from a
function in the user's code (``new``, with its shapes in ``shapes``) or converted from
a benchmark's folder (``convert``). App side: nothing here imports JAX."""

"""The evaluation harness: code that runs inside a worker process.

Everything here that needs JAX imports it; these modules are only imported by
``python -m kernels.harness.worker`` (and by ``tests``/``benchmarks`` that act as a
worker). The one exception is ``kernels.harness.protocol``, the pipe framing shared
with the app side, which imports nothing heavy. Nothing in the app process may import
any other module of this package.

``runtime`` adapts a task of any layout (native, JAXBench, MaxKernel) to one
interface: shape configurations, fresh inputs per key, reference, flops, and the
candidate's entry point.
"""

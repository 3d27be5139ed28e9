"""tilewright: a terminal workbench where a person and an LLM agent design and optimize
JAX/Pallas kernels together."""

"""Who proposes.

LLM providers (Anthropic's Claude through the official SDK), the offline agent
(templates, rule-based fixes, autotuner), the roles (planner, implementer, fixer,
tuner, analyst) and the context they are given, and the lessons remembered across
sessions. Agents only propose: the controller in ``sessions`` decides what runs.
May import ``kernels`` data types; never imports jax, textual, ``sessions`` or ``tui``.
"""

"""Model providers: one streamed reply from a model, as events, with retries and prices.

``provider`` is the interface (``Provider``, its events, tool-call parsing); ``claude``
implements it with the official ``anthropic`` SDK (streaming, tool use, prompt caching)
and ``openai_chat`` with the official ``openai`` SDK for any OpenAI-compatible endpoint.
``retry`` decides how long to wait after a failed request and what the user is told
meanwhile; ``prices`` says what a reply cost (or that the cost is unknown)."""

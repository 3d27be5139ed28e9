"""What a model is told and how its reply is read.

``roles`` names the five roles and the tools each answers with; ``context`` builds the
stable cached prefix and the per-turn context; ``evalfacts`` and ``evaltext`` turn one
evaluation into the numbers and the words the model reads; ``untrusted`` fences text
that came from a candidate so it is read as data; ``parsing`` turns a reply into a
``Proposal`` or a precise follow-up question."""

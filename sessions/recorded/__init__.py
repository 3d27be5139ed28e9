"""What is made from a recorded session, without running it again (except ``--verify``).

``replay`` folds a recorded session and prints it (``--verify`` re-judges it headless);
``report`` writes it as Markdown or HTML; ``export`` turns a version into a module for
the user's code and a pytest file; ``branch`` continues a recorded session live from
any event."""

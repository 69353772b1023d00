"""Training runs: ``watch`` (attnscope.watch) writes run folders while a model trains; ``runfile`` reads
and writes them (the format, crash-safe appends, log-spaced thinning within a size budget)."""

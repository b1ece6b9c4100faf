"""Documents: summary latency and quality, the penalty sweep behind the sampling defaults."""

"""Memory: the soak (hours of load), bytes kept per request (churn), caches that fill."""

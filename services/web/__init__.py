"""The HTTP side next to Chainlit: operators' routes, the edge (origins, safety headers, body bounds),
the upload guard, Chainlit state workarounds."""

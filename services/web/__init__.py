"""The HTTP side next to Chainlit: operators' routes, the upload guard, Chainlit state workarounds."""

"""The stages after the first rounds: each times new versions of a pick beside it."""

"""Measuring candidates on this CPU: sandboxes and rounds; nothing here decides."""

"""Handlers for the quick start's example schedules (examples/schedules/)."""

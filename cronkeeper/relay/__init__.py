"""``cronkeeper relay``: claim outbox jobs under a lease, publish each to the queue a team already
runs (Celery, RQ, Sidekiq, BullMQ), then mark it ``published`` (docs/relay.md)."""

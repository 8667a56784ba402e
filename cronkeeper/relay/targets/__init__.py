"""Relay targets: one module per kind, each exposing ``build(name, settings) -> Target``."""

KINDS = {
    "celery": "cronkeeper.relay.targets.celery",
    "rq": "cronkeeper.relay.targets.rq",
    "sidekiq": "cronkeeper.relay.targets.sidekiq",
    "bullmq": "cronkeeper.relay.targets.bullmq",
}
